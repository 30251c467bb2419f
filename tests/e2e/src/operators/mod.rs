//! Test stand-ins for the upstream operators, as pure functions: their admission rules,
//! the defaulting and merging they apply to what a provider renders, and the status
//! sequences their controllers write, each rule citing the upstream source it plays.

pub mod kuberay;
