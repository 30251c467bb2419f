//! Cosign signatures of kernel-cache images, and the image build that signs them.
//!
//! - [`verify`]: the controller's (and `kubeairunway cache verify`'s) verdict on a pinned
//!   image under a `KernelCachePolicy`, in modes `key`, `certificate`, `keyless` and
//!   `disabled`, over both signature formats cosign writes: the legacy simple-signing
//!   object and Sigstore bundles ([`bundle`]), read within bounds ([`fetch`]), with
//!   certificates checked by [`x509`] and keyless signatures by [`keyless`];
//! - [`sign`]: signing (the CLI, and tests' real signatures);
//! - [`build`]: `kubeairunway cache build`, a Triton or vLLM ([`vllm`]) cache directory
//!   packaged as a cache image, pushed, and optionally signed;
//! - [`error`]: why a signature was refused or an image could not be made.
//!
//! Only the controller and the CLI link this crate (and sigstore with it).

pub mod build;
pub mod bundle;
pub mod error;
pub mod fetch;
#[cfg(test)]
mod hostile_tests;
pub mod keyless;
pub mod sign;
pub mod verify;
pub mod vllm;
pub mod x509;
