//! The upstream operators as the tests play them: admission rules, defaulting and the
//! status sequences of the real controllers, as pure functions citing upstream.

pub mod kaito;
