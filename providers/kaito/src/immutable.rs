//! The rendered fields KAITO's validating webhook refuses to change on update. A change
//! of any of them must delete and recreate the object (the SDK runtime does, through
//! `Provider::immutable_fields`), never patch it.

/// Workspace fields (dot paths) KAITO declares immutable, among those this provider
/// renders:
///
/// - `inference.preset`: compared whole, `presetOptions.modelAccessSecret` included
///   ("field is immutable", `InferenceSpec.validateUpdate`,
///   api/v1beta1/workspace_validation.go:895-897@v0.12.0, :660-662@v0.10.0). So a new
///   Hugging Face token Secret name means a new Workspace.
/// - `resource.labelSelector` ("field is immutable", `ResourceSpec.validateUpdate`,
///   workspace_validation.go:813-821@v0.12.0, :578-586@v0.10.0): it comes from
///   `spec.nodeSelector`.
/// - `resource.instanceType` ("instanceType cannot be changed once set",
///   workspace_validation.go:791-811@v0.12.0, :556-576@v0.10.0): it comes from the
///   provider's instance-type settings.
///
/// Also immutable upstream but never rendered: `resource.count`, `resource.partition`;
/// `inference.template` may change but not appear or disappear, which only an engine
/// change (an identity field, recreated anyway) does.
pub const WORKSPACE: &[&str] = &[
    "inference.preset",
    "resource.labelSelector",
    "resource.instanceType",
];

/// InferenceSet fields KAITO declares immutable, among those rendered: none. Its update
/// validation checks only the instance type against the node provisioner and the
/// maintenance window (api/v1alpha1/inferenceset_validation.go:66-70@v0.12.0; nothing at
/// v0.10.0, :61-63); `template.resource.partition` is immutable in v1beta1
/// (api/v1beta1/inferenceset_validation.go:78-81@v0.12.0) and never rendered. The
/// InferenceSet controller rolls template changes out to its Workspaces itself.
pub const INFERENCE_SET: &[&str] = &[];

/// The immutable fields of a primary object of `kind`.
pub fn fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "Workspace" => WORKSPACE,
        "InferenceSet" => INFERENCE_SET,
        _ => &[],
    }
}
