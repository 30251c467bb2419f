//! The gateway: one OpenAI-compatible endpoint for every model through the Gateway API
//! Inference Extension (GAIE). For each ModelDeployment with `spec.gateway.enabled: true`
//! it makes, owned by the ModelDeployment, an InferencePool over the serving pods the
//! provider reports (`status.selector`, `status.endpoint.targetPort`: see
//! `kubeairunway_sdk::serving`), its endpoint picker (EPP) and an HTTPRoute from the chosen
//! Gateway, unless the provider's operator makes its own pool
//! (`status.endpoint.inferencePool`) or the user brings the route
//! (`spec.gateway.httpRouteRef`); it reports `status.gateway` and `GatewayReady`. It never
//! changes a Gateway.
//!
//! - [`render`]: the objects (pure).
//! - [`decide`]: what to make, which Gateway, which status (pure).
//! - [`controller`]: detection by discovery, watch caches, server-side apply.

pub mod controller;
pub mod decide;
pub mod render;

/// The field manager of the gateway's objects and its status fields (`status.gateway`,
/// `GatewayReady`).
pub const FIELD_MANAGER: &str = "kubeairunway-gateway";

/// Reasons of the `GatewayReady` condition.
pub mod reasons {
    /// True: the pool, picker and route exist and the Gateway has an address.
    pub const GATEWAY_CONFIGURED: &str = "GatewayConfigured";
    /// The API server serves no InferencePool `inference.networking.k8s.io/v1` or
    /// HTTPRoute `gateway.networking.k8s.io/v1`.
    pub const CRDS_NOT_AVAILABLE: &str = "CRDsNotAvailable";
    /// No Gateway to route from (none, several without a label, or the named one missing).
    pub const NO_GATEWAY: &str = "NoGateway";
    /// The provider has not reported its serving pods and their port yet.
    pub const AWAITING_SERVING_PODS: &str = "AwaitingServingPods";
    /// `spec.gateway.httpRouteRef` names an HTTPRoute that does not exist.
    pub const HTTP_ROUTE_NOT_FOUND: &str = "HTTPRouteNotFound";
    /// `spec.gateway.httpRouteRef` names an HTTPRoute with no backendRef to the pool.
    pub const HTTP_ROUTE_NOT_TO_POOL: &str = "HTTPRouteNotToPool";
    /// No HTTP(S) listener of the Gateway admits routes from the ModelDeployment's
    /// namespace (`allowedRoutes`, which core never changes).
    pub const ROUTE_NOT_ALLOWED: &str = "RouteNotAllowed";
    /// The Gateway has no address or no HTTP(S) listener yet.
    pub const GATEWAY_ADDRESS_PENDING: &str = "GatewayAddressPending";
    /// The Gateway's implementation did not accept the HTTPRoute or the InferencePool
    /// (`status.parents[].conditions` `Accepted=False`).
    pub const NOT_ACCEPTED: &str = "NotAcceptedByGateway";
    /// The Gateway's implementation could not resolve a reference of the HTTPRoute or the
    /// InferencePool (`ResolvedRefs=False`: e.g. the pool, or the endpoint picker's
    /// Service).
    pub const REFS_NOT_RESOLVED: &str = "RefsNotResolved";
    /// The API server refused one of the gateway's objects.
    pub const APPLY_FAILED: &str = "GatewayApplyFailed";
}

#[cfg(test)]
mod tests;
