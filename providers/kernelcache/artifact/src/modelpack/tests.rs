use std::collections::BTreeMap;

use oci_client::manifest::{OciDescriptor, OciImageManifest};

use super::*;

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn layer(media_type: &str, c: char, path: Option<&str>) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.into(),
        digest: digest(c),
        size: 10,
        annotations: path
            .map(|p| BTreeMap::from([(FILEPATH_ANNOTATION.to_string(), p.to_string())])),
        ..OciDescriptor::default()
    }
}

fn manifest(
    artifact_type: Option<&str>,
    config: &str,
    layers: Vec<OciDescriptor>,
) -> OciImageManifest {
    OciImageManifest {
        artifact_type: artifact_type.map(Into::into),
        config: OciDescriptor {
            media_type: config.into(),
            digest: digest('c'),
            size: 2,
            ..OciDescriptor::default()
        },
        layers,
        ..OciImageManifest::default()
    }
}

fn modelpack(layers: Vec<OciDescriptor>) -> OciImageManifest {
    manifest(Some(MODELPACK_ARTIFACT_TYPE), MODELPACK_CONFIG, layers)
}

#[test]
fn a_modelpack_manifest_plans_raw_files_at_their_paths_and_tars_at_the_root() {
    let m = modelpack(vec![
        layer(
            "application/vnd.cncf.model.weight.v1.raw",
            'a',
            Some("model.safetensors"),
        ),
        layer(
            "application/vnd.cncf.model.weight.config.v1.raw",
            'b',
            Some("config.json"),
        ),
        layer(
            "application/vnd.cncf.model.doc.v1.tar",
            'd',
            Some("README.md"),
        ),
        layer("application/vnd.cncf.model.code.v1.tar+gzip", 'e', None),
        layer(
            "application/vnd.cncf.model.dataset.v1.raw",
            'a',
            Some("sub/copy.safetensors"),
        ),
    ]);
    let plan = plan(&m).unwrap();
    assert_eq!(plan.format, Format::ModelPack);
    let packings: Vec<Packing> = plan.layers.iter().map(|l| l.packing.clone()).collect();
    assert_eq!(
        packings,
        [
            Packing::Raw("model.safetensors".into()),
            Packing::Raw("config.json".into()),
            Packing::Tar,
            Packing::TarGzip,
            Packing::Raw("sub/copy.safetensors".into()),
        ]
    );
    assert_eq!(plan.layers[0].hex(), "a".repeat(64));
    // The same blob twice is downloaded once.
    assert_eq!(plan.total(), 40);
}

#[test]
fn a_kitops_modelkit_plans_its_tar_layers() {
    let m = manifest(
        None,
        KITOPS_CONFIG,
        vec![
            layer("application/vnd.kitops.modelkit.model.v1.tar", 'a', None),
            layer(
                "application/vnd.kitops.modelkit.docs.v1.tar+gzip",
                'b',
                None,
            ),
            layer(
                "application/vnd.kitops.modelkit.modelpart.v1.tar",
                'd',
                None,
            ),
        ],
    );
    let plan = plan(&m).unwrap();
    assert_eq!(plan.format, Format::KitOps);
    assert_eq!(plan.layers[1].packing, Packing::TarGzip);
}

#[test]
fn other_artifacts_and_media_types_are_refused_by_name() {
    let image = manifest(
        None,
        "application/vnd.oci.image.config.v1+json",
        vec![layer(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            'a',
            None,
        )],
    );
    assert!(matches!(plan(&image), Err(PlanError::NotAModel { .. })));
    for refused in [
        "application/vnd.cncf.model.weight.v1.zip",
        "application/vnd.cncf.model.secret.v1.raw",
        "application/vnd.cncf.model.weight.v2.raw",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.kitops.modelkit.model.v1.tar",
    ] {
        let m = modelpack(vec![layer(refused, 'a', Some("f"))]);
        match plan(&m) {
            Err(PlanError::UnsupportedMediaType { media_type, .. }) => {
                assert_eq!(media_type, refused);
            }
            other => panic!("{refused}: {other:?}"),
        }
    }
    // zstd tars are read (ModelPack and KitOps).
    let zstd = modelpack(vec![layer(
        "application/vnd.cncf.model.weight.v1.tar+zstd",
        'a',
        None,
    )]);
    assert_eq!(plan(&zstd).unwrap().layers[0].packing, Packing::TarZstd);
    let kit_zstd = manifest(
        None,
        KITOPS_CONFIG,
        vec![layer(
            "application/vnd.kitops.modelkit.model.v1.tar+zstd",
            'a',
            None,
        )],
    );
    assert_eq!(plan(&kit_zstd).unwrap().layers[0].packing, Packing::TarZstd);
    // A KitOps ModelKit has no raw layers.
    let kit_raw = manifest(
        None,
        KITOPS_CONFIG,
        vec![layer(
            "application/vnd.kitops.modelkit.model.v1.raw",
            'a',
            Some("m"),
        )],
    );
    assert!(matches!(
        plan(&kit_raw),
        Err(PlanError::UnsupportedMediaType { .. })
    ));
}

#[test]
fn raw_layers_need_a_safe_unique_path_and_a_sha256_digest() {
    let raw = "application/vnd.cncf.model.weight.v1.raw";
    for hostile in [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a//b",
        "a\\b",
        ".",
        "a/",
    ] {
        let m = modelpack(vec![layer(raw, 'a', Some(hostile))]);
        assert!(
            matches!(plan(&m), Err(PlanError::BadLayer { .. })),
            "{hostile:?}"
        );
    }
    assert!(matches!(
        plan(&modelpack(vec![layer(raw, 'a', None)])),
        Err(PlanError::BadLayer { .. })
    ));
    let twice = modelpack(vec![layer(raw, 'a', Some("m")), layer(raw, 'b', Some("m"))]);
    assert!(plan(&twice).unwrap_err().to_string().contains("two layers"));
    let mut sha512 = layer(raw, 'a', Some("m"));
    sha512.digest = format!("sha512:{}", "a".repeat(128));
    assert!(matches!(
        plan(&modelpack(vec![sha512])),
        Err(PlanError::BadLayer { .. })
    ));
    assert!(matches!(
        plan(&modelpack(vec![])),
        Err(PlanError::BadLayer { .. })
    ));
}

#[test]
fn snapshot_ids_look_like_commits() {
    let d = format!("sha256:{}", "0123456789abcdef".repeat(4));
    assert_eq!(snapshot_id(&d).unwrap(), "0123456789abcdef".repeat(4)[..40]);
    assert_eq!(snapshot_id("sha256:abc"), None);
    assert_eq!(snapshot_id(&format!("sha512:{}", "a".repeat(64))), None);
}
