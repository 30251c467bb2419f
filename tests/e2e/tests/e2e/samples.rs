//! The generated samples against the real API server: the valid ones apply, and each
//! rejection sample is refused by the API server itself (CEL rules in the CRD, no
//! webhook) naming the field and giving the exact message of the specification.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kubeairunway_config::samples::{self, Rejection, Sample};
use kubeairunway_e2e::{apply_md, core_cluster};
use kubeairunway_sdk::ModelDeployment;

#[tokio::test]
async fn valid_samples_apply() {
    let (cluster, client) = core_cluster().await.unwrap();
    let ns = cluster.namespace("samples");
    let valid: Vec<Sample> = samples::all()
        .into_iter()
        .filter(|s| s.rejection.is_none())
        .collect();
    assert_eq!(valid.len(), 4);
    for sample in valid {
        let applied = apply_md(&client, &ns, "tests", &sample.manifest).await;
        assert!(
            applied.is_ok(),
            "sample {} refused: {:?}",
            sample.name,
            applied.err()
        );
        let name = sample.manifest["metadata"]["name"].as_str().unwrap();
        let md = Api::<ModelDeployment>::namespaced(client.clone(), &ns)
            .get(name)
            .await
            .unwrap();
        assert_eq!(
            md.spec.model.id.as_deref(),
            sample.manifest["spec"]["model"]["id"].as_str()
        );
    }
}

/// The API server's answer to `sample`: `None` when accepted.
async fn refusal(client: &kube::Client, ns: &str, sample: &Sample) -> Option<kube::core::Status> {
    match apply_md(client, ns, "tests", &sample.manifest).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(*status),
        Err(other) => panic!("sample {}: unexpected error {other}", sample.name),
    }
}

fn assert_refused_as(sample: &Sample, rejection: &Rejection, status: &kube::core::Status) {
    assert_eq!(status.code, 422, "sample {}: {status:?}", sample.name);
    let causes = &status.details.as_ref().expect("details").causes;
    assert_eq!(
        causes.len(),
        1,
        "sample {} breaks exactly one rule, got {causes:?}",
        sample.name
    );
    assert_eq!(causes[0].field, rejection.field, "sample {}", sample.name);
    assert!(
        causes[0].message.ends_with(rejection.message),
        "sample {}: message {:?} does not end with {:?}",
        sample.name,
        causes[0].message,
        rejection.message
    );
}

#[tokio::test]
async fn rejection_samples_are_refused_with_the_exact_message() {
    let (cluster, client) = core_cluster().await.unwrap();
    let ns = cluster.namespace("rejections");
    let rejected: Vec<Sample> = samples::all()
        .into_iter()
        .filter(|s| s.rejection.is_some())
        .collect();
    // The nine rules of the spec itself (engine.type is optional: core chooses the
    // engine), and three of spec.warmup: a name or inline fields, no time to live inline,
    // and the inline policies' own rule.
    assert_eq!(
        rejected.len(),
        12,
        "one sample per schema rule of the specification"
    );
    for sample in &rejected {
        let rejection = sample.rejection.as_ref().unwrap();
        let status = refusal(&client, &ns, sample)
            .await
            .unwrap_or_else(|| panic!("sample {} was accepted", sample.name));
        assert_refused_as(sample, rejection, &status);
    }
}

/// The rejection test can fail: the same CRD with one CEL rule removed, served under a
/// group of its own, accepts the sample that rule refuses.
#[tokio::test]
async fn a_crd_missing_a_rule_accepts_what_that_rule_refuses() {
    let (cluster, client) = core_cluster().await.unwrap();
    let group = "broken.kubeairunway.ai";
    let mut crd = serde_json::to_value(&kubeairunway_sdk::api::crds::all()[0]).unwrap();
    crd["metadata"]["name"] = format!("modeldeployments.{group}").into();
    crd["spec"]["group"] = group.into();
    let rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
        .as_array_mut()
        .unwrap();
    let before = rules.len();
    rules.retain(|r| r["message"] != "vLLM engine requires GPU (set resources.gpu.count > 0)");
    assert_eq!(rules.len(), before - 1);
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    kubeairunway_testcluster::install_crds(&client, &[crd])
        .await
        .unwrap();

    let sample = samples::all()
        .into_iter()
        .find(|s| s.name == "vllm-without-gpu")
        .unwrap();
    let mut manifest = sample.manifest.clone();
    manifest["apiVersion"] = format!("{group}/v1alpha1").into();
    manifest["metadata"]["namespace"] = cluster.namespace("broken").into();
    let mut ar = ApiResource::erase::<ModelDeployment>(&());
    ar.group = group.into();
    ar.api_version = format!("{group}/v1alpha1");
    let api: Api<DynamicObject> = Api::namespaced_with(
        client,
        manifest["metadata"]["namespace"].as_str().unwrap(),
        &ar,
    );
    let name = manifest["metadata"]["name"].as_str().unwrap();
    let accepted = api
        .patch(name, &PatchParams::apply("tests"), &Patch::Apply(&manifest))
        .await;
    assert!(
        accepted.is_ok(),
        "without its rule the sample is accepted: {:?}",
        accepted.err()
    );
}
