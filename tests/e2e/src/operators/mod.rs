//! The upstream operators as the e2e tests play them: their admission rules, their
//! defaulting and merging of what we render, and the status their controllers write,
//! each as pure functions citing the upstream code, and a loop that applies them to the
//! objects on a test API server.

pub mod dynamo;
pub mod kaito;
pub mod kuberay;
