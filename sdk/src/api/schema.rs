//! Schema pieces that schemars cannot express with attributes alone.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A free-form object the API server keeps as written
/// (`x-kubernetes-preserve-unknown-fields`), still structural.
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// `Vec<Condition>` as a list-map keyed by `type`, so that several field managers can
/// each own their own condition types under server-side apply.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let item =
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}
