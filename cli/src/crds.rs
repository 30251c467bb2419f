//! CRDs: the real upstream CRDs bundled into the binary (the newest of each in
//! `tests/fixtures/crds/upstream`, unmodified), CRD files given with `--upstream-crd`,
//! and installing CRDs into a cluster.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

/// Field manager of everything the CLI applies.
pub const FIELD_MANAGER: &str = "kubeairunway-cli";

/// The bundled upstream CRDs: (CRD name, file in `tests/fixtures/crds/upstream`, text).
/// `SOURCES.md` there says where each comes from.
pub const BUNDLED: &[(&str, &str, &str)] = &[
    (
        "workspaces.kaito.sh",
        "kaito.sh_workspaces.yaml",
        include_str!("../../tests/fixtures/crds/upstream/kaito.sh_workspaces.yaml"),
    ),
    (
        "inferencesets.kaito.sh",
        "kaito.sh_inferencesets.yaml",
        include_str!("../../tests/fixtures/crds/upstream/kaito.sh_inferencesets.yaml"),
    ),
    (
        "dynamographdeployments.nvidia.com",
        "nvidia.com_dynamographdeployments.yaml",
        include_str!("../../tests/fixtures/crds/upstream/nvidia.com_dynamographdeployments.yaml"),
    ),
    (
        "rayservices.ray.io",
        "ray.io_rayservices.yaml",
        include_str!("../../tests/fixtures/crds/upstream/ray.io_rayservices.yaml"),
    ),
    // What core's gateway makes and reads (GAIE v1.5.0, Gateway API v1.5.1).
    (
        "inferencepools.inference.networking.k8s.io",
        "inference.networking.k8s.io_inferencepools.yaml",
        include_str!(
            "../../tests/fixtures/crds/upstream/inference.networking.k8s.io_inferencepools.yaml"
        ),
    ),
    (
        "gatewayclasses.gateway.networking.k8s.io",
        "gateway.networking.k8s.io_gatewayclasses.yaml",
        include_str!(
            "../../tests/fixtures/crds/upstream/gateway.networking.k8s.io_gatewayclasses.yaml"
        ),
    ),
    (
        "gateways.gateway.networking.k8s.io",
        "gateway.networking.k8s.io_gateways.yaml",
        include_str!("../../tests/fixtures/crds/upstream/gateway.networking.k8s.io_gateways.yaml"),
    ),
    (
        "httproutes.gateway.networking.k8s.io",
        "gateway.networking.k8s.io_httproutes.yaml",
        include_str!(
            "../../tests/fixtures/crds/upstream/gateway.networking.k8s.io_httproutes.yaml"
        ),
    ),
    (
        "referencegrants.gateway.networking.k8s.io",
        "gateway.networking.k8s.io_referencegrants.yaml",
        include_str!(
            "../../tests/fixtures/crds/upstream/gateway.networking.k8s.io_referencegrants.yaml"
        ),
    ),
];

/// Every CRD in a YAML text (one or more documents); other kinds are an error.
pub fn parse(text: &str, origin: &str) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).with_context(|| format!("{origin}: not YAML"))?;
    let mut crds = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        if kind != "CustomResourceDefinition" {
            anyhow::bail!(
                "{origin}: document {} is {}, not a CustomResourceDefinition",
                i + 1,
                if kind.is_empty() {
                    "without a kind"
                } else {
                    kind
                }
            );
        }
        crds.push(
            serde_json::from_value(doc)
                .with_context(|| format!("{origin}: document {} is not a valid CRD", i + 1))?,
        );
    }
    Ok(crds)
}

/// The upstream CRDs a preview renders against: files given on the command line first,
/// then the bundled ones.
#[derive(Clone, Debug, Default)]
pub struct UpstreamCrds {
    given: BTreeMap<String, CustomResourceDefinition>,
}

impl UpstreamCrds {
    /// The bundled CRDs, replaced by those in `files` that have the same name.
    pub fn with_files(files: &[impl AsRef<Path>]) -> anyhow::Result<Self> {
        let mut given = BTreeMap::new();
        for file in files {
            let path = file.as_ref();
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --upstream-crd {}", path.display()))?;
            let crds = parse(&text, &path.display().to_string())?;
            if crds.is_empty() {
                anyhow::bail!("{}: no CustomResourceDefinition in it", path.display());
            }
            for crd in crds {
                given.insert(crd.name_any(), crd);
            }
        }
        Ok(Self { given })
    }

    /// The CRD named `name` (`<plural>.<group>`), if given or bundled.
    pub fn get(&self, name: &str) -> anyhow::Result<Option<CustomResourceDefinition>> {
        if let Some(crd) = self.given.get(name) {
            return Ok(Some(crd.clone()));
        }
        bundled(name)
    }
}

/// The bundled CRD named `name`, if there is one.
pub fn bundled(name: &str) -> anyhow::Result<Option<CustomResourceDefinition>> {
    let Some((_, file, text)) = BUNDLED.iter().find(|(n, _, _)| *n == name) else {
        return Ok(None);
    };
    let crd = parse(text, file)?.into_iter().next();
    Ok(crd)
}

/// Every bundled CRD.
pub fn all_bundled() -> anyhow::Result<Vec<CustomResourceDefinition>> {
    BUNDLED
        .iter()
        .map(|(name, _, _)| bundled(name)?.with_context(|| format!("bundled CRD {name} is empty")))
        .collect()
}

/// Server-side apply `crds` (forced, as [`FIELD_MANAGER`]) and wait until each is
/// Established.
pub async fn install(client: &Client, crds: &[CustomResourceDefinition]) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.name_any();
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in crds {
        let name = crd.name_any();
        tokio::time::timeout(
            Duration::from_secs(60),
            kube::runtime::wait::await_condition(
                api.clone(),
                &name,
                kube::runtime::conditions::is_crd_established(),
            ),
        )
        .await
        .with_context(|| format!("CRD {name} not established after 60s"))??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_crd_parses_under_its_name() {
        for (name, file, _) in BUNDLED {
            let crd = bundled(name).unwrap().unwrap();
            assert_eq!(crd.name_any(), *name, "{file}");
        }
    }

    #[test]
    fn given_files_replace_bundled_crds_of_the_same_name() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("rayservices.yaml");
        std::fs::write(
            &old,
            include_str!("../../tests/fixtures/crds/upstream/ray.io_rayservices.v1.3.0.yaml"),
        )
        .unwrap();
        let crds = UpstreamCrds::with_files(&[&old]).unwrap();
        let given = crds.get("rayservices.ray.io").unwrap().unwrap();
        let bundled = bundled("rayservices.ray.io").unwrap().unwrap();
        assert_ne!(given, bundled);
        assert!(crds.get("workspaces.kaito.sh").unwrap().is_some());
        assert!(crds.get("widgets.example.com").unwrap().is_none());

        let not_a_crd = dir.path().join("md.yaml");
        std::fs::write(&not_a_crd, "apiVersion: v1\nkind: ConfigMap\n").unwrap();
        let err = UpstreamCrds::with_files(&[&not_a_crd]).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("document 1 is ConfigMap, not a CustomResourceDefinition"),
            "{err}"
        );
    }
}
