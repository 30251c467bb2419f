//! TLS for the webhooks, managed by the controller itself (the job
//! open-policy-agent's cert-controller does for other controllers): a self-signed CA and a serving certificate for the webhook Service's DNS
//! names, made with rcgen and kept in two Secrets that every replica shares (the CA's
//! certificate and key in one, the serving pair and the CA bundle in the other, so that
//! whoever may read the serving Secret does not get the key that signs for the webhook);
//! the CA bundle patched into the webhook configurations; rotation before expiry; and hot
//! reload of the serving certificate ([`CertResolver`]) without a restart.
//!
//! All Secret and webhook-configuration I/O goes through [`CertStore`], so rotation is
//! tested without a cluster ([`MemoryCertStore`]); [`KubeCertStore`] is the real one.
//! Replicas coordinate through the Secrets' resourceVersions: whoever writes first wins,
//! the others load what it wrote.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// Subject common name of the CA.
const CA_NAME: &str = "kubeairunway-webhook-ca";

/// Errors of certificate management.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rcgen failed.
    #[error("generating certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A stored certificate or key does not parse.
    #[error("invalid certificate data: {0}")]
    Invalid(String),
    /// The store failed.
    #[error("certificate store: {0}")]
    Store(String),
}

/// Names and lifetimes (flags of the controller).
#[derive(Clone, Debug)]
pub struct CertSettings {
    /// The webhook Service's name.
    pub service_name: String,
    /// The namespace of the Service and the Secrets.
    pub namespace: String,
    /// How long a new CA is valid.
    pub ca_validity: Duration,
    /// How long a new serving certificate is valid.
    pub cert_validity: Duration,
    /// Rotate a certificate this long before it expires.
    pub rotate_before: Duration,
}

impl CertSettings {
    /// The DNS names of the webhook Service.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, ns) = (&self.service_name, &self.namespace);
        vec![
            s.clone(),
            format!("{s}.{ns}"),
            format!("{s}.{ns}.svc"),
            format!("{s}.{ns}.svc.cluster.local"),
        ]
    }
}

/// The CA and the serving certificate: `ca.crt` (the CA bundle: the signing CA first, then
/// a previous CA still valid during a CA rotation) and `ca.key` are kept in the CA Secret
/// ([`CertBundle::ca_data`]); `ca.crt`, `tls.crt`, `tls.key` and an empty `ca.key` in the
/// serving Secret ([`CertBundle::serving_data`]).
#[derive(Clone, PartialEq, Eq)]
pub struct CertBundle {
    /// CA bundle (PEM, one or more certificates; the first signs).
    pub ca_crt: String,
    /// Private key of the first CA (PEM).
    pub ca_key: String,
    /// Serving certificate (PEM).
    pub tls_crt: String,
    /// Serving key (PEM).
    pub tls_key: String,
}

impl fmt::Debug for CertBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertBundle")
            .field("ca_crt", &self.ca_crt)
            .field("tls_crt", &self.tls_crt)
            .finish_non_exhaustive()
    }
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn ca_params(not_before: SystemTime, not_after: SystemTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = offset(not_before);
    params.not_after = offset(not_after);
    params
}

/// The `notAfter` of each certificate in a PEM bundle.
pub fn not_after(pem: &str) -> Result<Vec<SystemTime>, Error> {
    let mut out = Vec::new();
    for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = der.map_err(|e| Error::Invalid(e.to_string()))?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(&der).map_err(|e| Error::Invalid(e.to_string()))?;
        let ts = cert.validity().not_after.timestamp();
        out.push(UNIX_EPOCH + Duration::from_secs(u64::try_from(ts).unwrap_or(0)));
    }
    if out.is_empty() {
        return Err(Error::Invalid("no certificate in PEM".into()));
    }
    Ok(out)
}

/// The DNS names of the first certificate in a PEM bundle.
pub fn dns_names(pem: &str) -> Result<Vec<String>, Error> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| Error::Invalid("no certificate in PEM".into()))?
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| Error::Invalid(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(san
        .map(|s| {
            s.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Whether the first certificate of `leaf_pem` names the first certificate of `ca_pem` as
/// its issuer (authority key identifier = the CA's subject key identifier). The two live
/// in different Secrets, so a crash between their writes can leave a leaf of a previous CA.
fn issued_by(leaf_pem: &str, ca_pem: &str) -> bool {
    let first = |pem: &str| {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .next()
            .and_then(Result::ok)
    };
    let (Some(leaf), Some(ca)) = (first(leaf_pem), first(ca_pem)) else {
        return false;
    };
    let (Ok((_, leaf)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(&leaf),
        x509_parser::parse_x509_certificate(&ca),
    ) else {
        return false;
    };
    let aki = leaf
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(a) => {
                a.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            _ => None,
        });
    let ski = ca
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
            _ => None,
        });
    aki.is_some() && aki == ski
}

fn remaining(t: SystemTime, now: SystemTime) -> Duration {
    t.duration_since(now).unwrap_or_default()
}

impl CertBundle {
    /// A new CA and a serving certificate signed by it.
    pub fn generate(settings: &CertSettings, now: SystemTime) -> Result<Self, Error> {
        let ca_key = KeyPair::generate()?;
        let params = ca_params(now - Duration::from_secs(60), now + settings.ca_validity);
        let ca_cert = params.self_signed(&ca_key)?;
        let mut bundle = Self {
            ca_crt: ca_cert.pem(),
            ca_key: ca_key.serialize_pem(),
            tls_crt: String::new(),
            tls_key: String::new(),
        };
        bundle.issue_leaf(settings, now)?;
        Ok(bundle)
    }

    /// Replace the serving certificate with a new one signed by the bundle's CA.
    fn issue_leaf(&mut self, settings: &CertSettings, now: SystemTime) -> Result<(), Error> {
        let ca_key = KeyPair::from_pem(&self.ca_key).map_err(|e| Error::Invalid(e.to_string()))?;
        // The issuer is identified by its subject and key; the validity of these params
        // is not used for signing.
        let issuer = Issuer::new(ca_params(now, now), ca_key);
        let mut params = CertificateParams::new(settings.dns_names())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, settings.dns_names()[2].clone());
        params.distinguished_name = dn;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = offset(now - Duration::from_secs(60));
        let ca_end = not_after(&self.ca_crt)?[0];
        params.not_after = offset((now + settings.cert_validity).min(ca_end));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        self.tls_crt = cert.pem();
        self.tls_key = key.serialize_pem();
        Ok(())
    }

    /// What to do with this bundle now: `None` when it is good, or the rotated bundle.
    pub fn rotated(&self, settings: &CertSettings, now: SystemTime) -> Result<Option<Self>, Error> {
        let ca_ends = not_after(&self.ca_crt)?;
        // A certificate for other names (the Service was renamed) is replaced at once.
        let names_ok = dns_names(&self.tls_crt).is_ok_and(|mut n| {
            let mut want = settings.dns_names();
            n.sort();
            want.sort();
            n == want
        });
        let leaf_ok = names_ok
            && issued_by(&self.tls_crt, &self.ca_crt)
            && not_after(&self.tls_crt)
                .is_ok_and(|t| remaining(t[0], now) > settings.rotate_before);
        let key_ok = self.certified_key().is_ok();
        // The CA must outlive a full new serving certificate plus the rotation margin.
        let ca_ok = remaining(ca_ends[0], now) > settings.rotate_before + settings.cert_validity
            || remaining(ca_ends[0], now) > settings.rotate_before && leaf_ok;
        if leaf_ok && key_ok && ca_ok {
            return Ok(None);
        }
        if ca_ok {
            let mut next = self.clone();
            next.issue_leaf(settings, now)?;
            return Ok(Some(next));
        }
        // New CA; keep the old one in the bundle while it is valid, so replicas still
        // serving a certificate it signed stay trusted until they reload.
        let mut next = Self::generate(settings, now)?;
        let old: Vec<_> = CertificateDer::pem_slice_iter(self.ca_crt.as_bytes())
            .flatten()
            .zip(ca_ends)
            .filter(|(_, end)| *end > now)
            .take(1)
            .collect();
        for (der, _) in old {
            next.ca_crt.push_str(&pem_cert(&der));
        }
        Ok(Some(next))
    }

    /// The serving certificate and key, ready for rustls.
    pub fn certified_key(&self) -> Result<Arc<CertifiedKey>, Error> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.tls_crt.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| Error::Invalid(e.to_string()))?;
        if certs.is_empty() {
            return Err(Error::Invalid("no serving certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(self.tls_key.as_bytes())
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        Ok(Arc::new(CertifiedKey::new(certs, key)))
    }

    /// The serving Secret's data: the serving pair, the CA bundle, and an empty `ca.key`.
    /// Empty, not absent: a Secret of the single-Secret layout loses its CA key once the
    /// CA Secret holds it, while a replica of that earlier release, still running during
    /// the upgrade, reads a Secret it understands and keeps its certificate (it wants the
    /// key only to issue one; without the entry it would make a new CA).
    pub fn serving_data(&self) -> BTreeMap<String, ByteString> {
        data_of(&[
            ("ca.crt", &self.ca_crt),
            ("ca.key", &String::new()),
            ("tls.crt", &self.tls_crt),
            ("tls.key", &self.tls_key),
        ])
    }

    /// The CA Secret's data: the CA bundle and the signing CA's key.
    pub fn ca_data(&self) -> BTreeMap<String, ByteString> {
        data_of(&[("ca.crt", &self.ca_crt), ("ca.key", &self.ca_key)])
    }

    /// The bundle kept in a serving Secret's and a CA Secret's data, and whether the
    /// Secrets must be written again although the bundle is good: the CA is still in the
    /// serving Secret (the single-Secret layout of earlier releases, read from there while
    /// the CA Secret is empty, then moved). `None`: no CA anywhere, make one.
    pub fn from_secrets(
        serving: Option<&BTreeMap<String, ByteString>>,
        ca: Option<&BTreeMap<String, ByteString>>,
    ) -> (Option<Self>, bool) {
        let get = |data: Option<&BTreeMap<String, ByteString>>, k: &str| {
            data.and_then(|d| d.get(k))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .filter(|v| !v.is_empty())
        };
        let key_in_serving = get(serving, "ca.key").is_some();
        let (ca_crt, ca_key) = match (get(ca, "ca.crt"), get(ca, "ca.key")) {
            (Some(c), Some(k)) => (c, k),
            _ => match (get(serving, "ca.crt"), get(serving, "ca.key")) {
                (Some(c), Some(k)) => (c, k),
                _ => return (None, false),
            },
        };
        let bundle = Self {
            ca_crt,
            ca_key,
            tls_crt: get(serving, "tls.crt").unwrap_or_default(),
            tls_key: get(serving, "tls.key").unwrap_or_default(),
        };
        (Some(bundle), key_in_serving)
    }
}

fn data_of(entries: &[(&str, &String)]) -> BTreeMap<String, ByteString> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

fn pem_cert(der: &CertificateDer<'_>) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The outcome of a conditional write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// Written.
    Yes,
    /// Someone else wrote first; load again.
    Conflict,
}

/// What a [`CertStore`] holds.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The bundle (`None`: no CA yet, or unreadable data: make a new one).
    pub bundle: Option<CertBundle>,
    /// The version to write against.
    pub version: String,
    /// Write the bundle again even if it is good: it is not stored the way it should be
    /// (the CA key still in the serving Secret).
    pub rewrite: bool,
}

/// Where the certificates live and where the CA bundle goes.
pub trait CertStore: Send + Sync {
    /// The stored bundle and its version, if anything is stored (unreadable data counts
    /// as a bundle to replace: return `bundle: None` with the version).
    fn load(&self) -> impl Future<Output = Result<Option<Stored>, Error>> + Send;
    /// Write `bundle` if the stored version is still `version` (`None`: create).
    fn save(
        &self,
        bundle: &CertBundle,
        version: Option<&str>,
    ) -> impl Future<Output = Result<Saved, Error>> + Send;
    /// Put the CA bundle into the webhook configurations.
    fn publish_ca_bundle(&self, ca_pem: &str) -> impl Future<Output = Result<(), Error>> + Send;
}

/// The serving Secret's and the CA Secret's data.
pub type SecretsData = (BTreeMap<String, ByteString>, BTreeMap<String, ByteString>);

/// The two Secrets' data with their version, and the CA bundles published.
type MemoryState = (Option<(SecretsData, u64)>, Vec<String>);

/// An in-memory store of the two Secrets' data, shared by clones (for tests and the
/// benchmark); it splits and reads the data as [`KubeCertStore`] does.
#[derive(Clone, Debug, Default)]
pub struct MemoryCertStore {
    inner: Arc<Mutex<MemoryState>>,
}

impl MemoryCertStore {
    /// The CA bundles published so far.
    pub fn published(&self) -> Vec<String> {
        self.inner.lock().map(|g| g.1.clone()).unwrap_or_default()
    }

    /// The stored bundle.
    pub fn stored(&self) -> Option<CertBundle> {
        let (serving, ca) = self.data()?;
        CertBundle::from_secrets(Some(&serving), Some(&ca)).0
    }

    /// The stored data of the serving Secret and of the CA Secret.
    pub fn data(&self) -> Option<SecretsData> {
        self.inner
            .lock()
            .ok()
            .and_then(|g| g.0.as_ref().map(|(d, _)| d.clone()))
    }

    /// Replace the stored bundle (as another replica would).
    pub fn put(&self, bundle: &CertBundle) {
        self.put_data((bundle.serving_data(), bundle.ca_data()));
    }

    /// Replace the stored data of both Secrets (e.g. as an earlier release left them).
    pub fn put_data(&self, data: SecretsData) {
        if let Ok(mut g) = self.inner.lock() {
            let v = g.0.as_ref().map_or(1, |(_, v)| v + 1);
            g.0 = Some((data, v));
        }
    }
}

impl CertStore for MemoryCertStore {
    async fn load(&self) -> Result<Option<Stored>, Error> {
        let g = self.inner.lock().map_err(|e| Error::Store(e.to_string()))?;
        Ok(g.0.as_ref().map(|((serving, ca), v)| {
            let (bundle, rewrite) = CertBundle::from_secrets(Some(serving), Some(ca));
            Stored {
                bundle,
                version: v.to_string(),
                rewrite,
            }
        }))
    }

    async fn save(&self, bundle: &CertBundle, version: Option<&str>) -> Result<Saved, Error> {
        let mut g = self.inner.lock().map_err(|e| Error::Store(e.to_string()))?;
        let current = g.0.as_ref().map(|(_, v)| v.to_string());
        if current.as_deref() != version {
            return Ok(Saved::Conflict);
        }
        let next = g.0.as_ref().map_or(1, |(_, v)| v + 1);
        g.0 = Some(((bundle.serving_data(), bundle.ca_data()), next));
        Ok(Saved::Yes)
    }

    async fn publish_ca_bundle(&self, ca_pem: &str) -> Result<(), Error> {
        let mut g = self.inner.lock().map_err(|e| Error::Store(e.to_string()))?;
        if g.1.last().map(String::as_str) != Some(ca_pem) {
            g.1.push(ca_pem.to_string());
        }
        Ok(())
    }
}

/// The real store: a `kubernetes.io/tls` Secret for the serving pair, an `Opaque` one for
/// the CA, and the two webhook configurations.
#[derive(Clone)]
pub struct KubeCertStore {
    secrets: Api<Secret>,
    secret_name: String,
    ca_secret_name: String,
    validating: Api<ValidatingWebhookConfiguration>,
    validating_name: String,
    mutating: Api<MutatingWebhookConfiguration>,
    mutating_name: String,
}

impl fmt::Debug for KubeCertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeCertStore")
            .field("secret_name", &self.secret_name)
            .field("ca_secret_name", &self.ca_secret_name)
            .field("validating_name", &self.validating_name)
            .field("mutating_name", &self.mutating_name)
            .finish_non_exhaustive()
    }
}

impl KubeCertStore {
    /// A store for the serving Secret `secret_name` and the CA Secret `ca_secret_name` in
    /// `namespace`, and the named webhook configurations. An empty configuration name
    /// means there is none of that kind to patch.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        secret_name: &str,
        ca_secret_name: &str,
        validating_name: &str,
        mutating_name: &str,
    ) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            secret_name: secret_name.into(),
            ca_secret_name: ca_secret_name.into(),
            validating: Api::all(client.clone()),
            validating_name: validating_name.into(),
            mutating: Api::all(client),
            mutating_name: mutating_name.into(),
        }
    }
}

fn store_err(e: impl fmt::Display) -> Error {
    Error::Store(e.to_string())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// JSON patch setting `clientConfig.caBundle` on every webhook of a configuration.
fn ca_bundle_patch(webhooks: usize, ca_pem: &str) -> Result<json_patch::Patch, Error> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let ops: Vec<serde_json::Value> = (0..webhooks)
        .map(|i| serde_json::json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": b64}))
        .collect();
    serde_json::from_value(serde_json::Value::Array(ops)).map_err(store_err)
}

impl KubeCertStore {
    /// Write one Secret's data: create it (`version` `None`) or merge-patch its data and
    /// our label, conditional on the version read: the Secret may be a chart's, whose own
    /// labels and annotations (Helm's ownership) must stay.
    async fn write(
        &self,
        name: &str,
        type_: &str,
        data: BTreeMap<String, ByteString>,
        version: Option<&str>,
    ) -> Result<Saved, Error> {
        let labels: BTreeMap<String, String> = [(
            crate::labels::MANAGED_BY.to_string(),
            crate::labels::MANAGED_BY_VALUE.to_string(),
        )]
        .into();
        let result = match version {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    },
                    type_: Some(type_.into()),
                    data: Some(data),
                    ..Secret::default()
                };
                self.secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map(|_| ())
            }
            Some(v) => {
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": v, "labels": labels},
                    "data": data,
                });
                self.secrets
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(Saved::Yes),
            Err(e) if is_conflict(&e) => Ok(Saved::Conflict),
            Err(e) => Err(store_err(e)),
        }
    }
}

/// The version of the two Secrets: `<serving>/<CA>`, the CA's empty while it does not
/// exist.
fn split_version(version: &str) -> (&str, Option<&str>) {
    let (serving, ca) = version.split_once('/').unwrap_or((version, ""));
    (serving, (!ca.is_empty()).then_some(ca))
}

impl CertStore for KubeCertStore {
    async fn load(&self) -> Result<Option<Stored>, Error> {
        let Some(serving) = self
            .secrets
            .get_opt(&self.secret_name)
            .await
            .map_err(store_err)?
        else {
            return Ok(None);
        };
        let ca = self
            .secrets
            .get_opt(&self.ca_secret_name)
            .await
            .map_err(store_err)?;
        let rv = |s: &Secret| s.metadata.resource_version.clone().unwrap_or_default();
        let version = format!(
            "{}/{}",
            rv(&serving),
            ca.as_ref().map(rv).unwrap_or_default()
        );
        let (bundle, rewrite) = CertBundle::from_secrets(
            serving.data.as_ref(),
            ca.as_ref().and_then(|c| c.data.as_ref()),
        );
        Ok(Some(Stored {
            bundle,
            version,
            rewrite,
        }))
    }

    /// The CA Secret first: the serving Secret's leaf may lag behind it (it is then
    /// reissued, see [`CertBundle::rotated`]), but never a CA key behind a leaf it signed.
    async fn save(&self, bundle: &CertBundle, version: Option<&str>) -> Result<Saved, Error> {
        let (serving_version, ca_version) = match version {
            Some(v) => {
                let (s, c) = split_version(v);
                (Some(s), c)
            }
            None => (None, None),
        };
        if self
            .write(&self.ca_secret_name, "Opaque", bundle.ca_data(), ca_version)
            .await?
            == Saved::Conflict
        {
            return Ok(Saved::Conflict);
        }
        self.write(
            &self.secret_name,
            "kubernetes.io/tls",
            bundle.serving_data(),
            serving_version,
        )
        .await
    }

    async fn publish_ca_bundle(&self, ca_pem: &str) -> Result<(), Error> {
        let pp = PatchParams::default();
        let wanted = ca_pem.as_bytes();
        // An empty name: this component has no configuration of that kind.
        let validating = if self.validating_name.is_empty() {
            None
        } else {
            self.validating
                .get_opt(&self.validating_name)
                .await
                .map_err(store_err)?
        };
        if let Some(v) = validating {
            let hooks = v.webhooks.unwrap_or_default();
            if hooks
                .iter()
                .any(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(wanted))
            {
                let patch = ca_bundle_patch(hooks.len(), ca_pem)?;
                self.validating
                    .patch(&self.validating_name, &pp, &Patch::<()>::Json(patch))
                    .await
                    .map_err(store_err)?;
            }
        } else if !self.validating_name.is_empty() {
            warn!(name = %self.validating_name, "validating webhook configuration not found");
        }
        let mutating = if self.mutating_name.is_empty() {
            None
        } else {
            self.mutating
                .get_opt(&self.mutating_name)
                .await
                .map_err(store_err)?
        };
        if let Some(m) = mutating {
            let hooks = m.webhooks.unwrap_or_default();
            if hooks
                .iter()
                .any(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(wanted))
            {
                let patch = ca_bundle_patch(hooks.len(), ca_pem)?;
                self.mutating
                    .patch(&self.mutating_name, &pp, &Patch::<()>::Json(patch))
                    .await
                    .map_err(store_err)?;
            }
        } else if !self.mutating_name.is_empty() {
            warn!(name = %self.mutating_name, "mutating webhook configuration not found");
        }
        Ok(())
    }
}

/// A rustls certificate resolver whose certificate can be swapped at any time; every new
/// TLS handshake gets the current one.
#[derive(Default)]
pub struct CertResolver {
    current: ArcSwapOption<CertifiedKey>,
    pem: Mutex<Option<String>>,
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver")
            .field("loaded", &self.current.load().is_some())
            .finish_non_exhaustive()
    }
}

impl CertResolver {
    /// Serve this bundle's certificate from now on (no-op when it is already served).
    pub fn install(&self, bundle: &CertBundle) -> Result<bool, Error> {
        let mut pem = self.pem.lock().map_err(|e| Error::Store(e.to_string()))?;
        if pem.as_deref() == Some(bundle.tls_crt.as_str()) {
            return Ok(false);
        }
        self.current.store(Some(bundle.certified_key()?));
        *pem = Some(bundle.tls_crt.clone());
        Ok(true)
    }

    /// Whether a certificate is loaded.
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The PEM of the certificate being served.
    pub fn serving_pem(&self) -> Option<String> {
        self.pem.lock().ok().and_then(|p| p.clone())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

/// The rustls server configuration for the webhook server (ring, TLS 1.2 and 1.3, h2 and
/// HTTP/1.1), serving whatever `resolver` holds.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<Arc<rustls::ServerConfig>, Error> {
    server_config_with_clients(resolver, None)
}

/// [`server_config`], requiring with `client_ca` (PEM certificates) that every client
/// presents a certificate it signed: the API server, given one by its admission
/// configuration's `kubeConfigFile`, and nobody else. A client without one fails the TLS
/// handshake, before any request is read.
pub fn server_config_with_clients(
    resolver: Arc<CertResolver>,
    client_ca: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| Error::Invalid(format!("client CA: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::Invalid(format!("client CA: {e}")))?;
            }
            if roots.is_empty() {
                return Err(Error::Invalid("client CA: no certificate in it".into()));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| Error::Invalid(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Keeps the serving certificate valid: creates, rotates, shares and reloads it.
#[derive(Debug)]
pub struct CertManager<S> {
    store: S,
    settings: CertSettings,
    resolver: Arc<CertResolver>,
}

impl<S: CertStore> CertManager<S> {
    /// A manager over `store`, serving through `resolver`.
    pub fn new(store: S, settings: CertSettings, resolver: Arc<CertResolver>) -> Self {
        Self {
            store,
            settings,
            resolver,
        }
    }

    /// Make sure a valid certificate is stored, published and served; returns the bundle
    /// in force.
    pub async fn ensure(&self) -> Result<CertBundle, Error> {
        for _ in 0..5 {
            let now = SystemTime::now();
            let loaded = self.store.load().await?;
            let (bundle, version) = match loaded {
                Some(Stored {
                    bundle: Some(b),
                    version: v,
                    rewrite,
                }) => match b.rotated(&self.settings, now) {
                    Ok(None) if rewrite => {
                        info!("moving the webhook CA key out of the serving certificate's Secret");
                        (b, Some(Some(v)))
                    }
                    Ok(None) => (b, None),
                    Ok(Some(next)) => (next, Some(Some(v))),
                    Err(e) => {
                        warn!(error = %e, "stored webhook certificate unreadable; replacing it");
                        (CertBundle::generate(&self.settings, now)?, Some(Some(v)))
                    }
                },
                Some(Stored {
                    bundle: None,
                    version: v,
                    ..
                }) => (CertBundle::generate(&self.settings, now)?, Some(Some(v))),
                None => (CertBundle::generate(&self.settings, now)?, Some(None)),
            };
            if let Some(version) = version {
                match self.store.save(&bundle, version.as_deref()).await? {
                    Saved::Yes => info!("stored a new webhook serving certificate"),
                    Saved::Conflict => continue,
                }
            }
            self.store.publish_ca_bundle(&bundle.ca_crt).await?;
            if self.resolver.install(&bundle)? {
                info!("serving a new webhook certificate");
            }
            return Ok(bundle);
        }
        Err(Error::Store(
            "the certificate Secret kept changing under us".into(),
        ))
    }

    /// Call [`ensure`](Self::ensure) every `interval` until `shutdown`; after a failure,
    /// retry sooner (from 1 s, doubling, at most `interval`).
    pub async fn run(self, interval: Duration, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut retry = Duration::from_secs(1);
        loop {
            let wait = match self.ensure().await {
                Ok(_) => {
                    retry = Duration::from_secs(1);
                    interval
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?retry, "webhook certificate check failed");
                    let wait = retry.min(interval);
                    retry = (retry * 2).min(interval);
                    wait
                }
            };
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cert: u64, before: u64) -> CertSettings {
        CertSettings {
            service_name: "kubeairunway-webhook".into(),
            namespace: "kubeairunway-system".into(),
            ca_validity: Duration::from_secs(365 * 86400),
            cert_validity: Duration::from_secs(cert),
            rotate_before: Duration::from_secs(before),
        }
    }

    #[tokio::test]
    async fn creates_then_keeps_then_rotates() {
        let store = MemoryCertStore::default();
        let resolver = Arc::new(CertResolver::default());
        let m = CertManager::new(store.clone(), settings(86400, 3600), Arc::clone(&resolver));
        let first = m.ensure().await.unwrap();
        assert!(resolver.is_loaded());
        assert_eq!(store.published(), vec![first.ca_crt.clone()]);
        let again = m.ensure().await.unwrap();
        assert_eq!(first, again, "a valid certificate is kept");

        // Lifetimes shorter than the rotation margin: rotate at once, same CA.
        let m2 = CertManager::new(store.clone(), settings(7200, 86400), Arc::clone(&resolver));
        let rotated = m2.ensure().await.unwrap();
        assert_ne!(rotated.tls_crt, first.tls_crt);
        assert_eq!(rotated.ca_crt, first.ca_crt);
        assert_eq!(
            resolver.serving_pem().as_deref(),
            Some(rotated.tls_crt.as_str())
        );
    }

    #[tokio::test]
    async fn another_replicas_write_wins() {
        let store = MemoryCertStore::default();
        let a = CertManager::new(
            store.clone(),
            settings(86400, 3600),
            Arc::new(CertResolver::default()),
        );
        let b_resolver = Arc::new(CertResolver::default());
        let b = CertManager::new(
            store.clone(),
            settings(86400, 3600),
            Arc::clone(&b_resolver),
        );
        let ours = a.ensure().await.unwrap();
        let theirs = b.ensure().await.unwrap();
        assert_eq!(
            ours, theirs,
            "the second replica loads the first one's certificate"
        );
        assert_eq!(
            b_resolver.serving_pem().as_deref(),
            Some(ours.tls_crt.as_str())
        );
        // Conditional write: a stale version conflicts.
        assert_eq!(store.save(&ours, Some("0")).await.unwrap(), Saved::Conflict);
    }

    #[test]
    fn ca_rotation_keeps_the_old_ca_in_the_bundle() {
        let s = settings(3600, 600);
        let now = SystemTime::now();
        let mut short_ca = s.clone();
        short_ca.ca_validity = Duration::from_secs(3000);
        let old = CertBundle::generate(&short_ca, now).unwrap();
        assert_eq!(
            old.rotated(&s, now).unwrap(),
            None,
            "fine while the leaf is"
        );
        let later = now + Duration::from_secs(2500);
        let next = old.rotated(&s, later).unwrap().unwrap();
        assert_eq!(not_after(&next.ca_crt).unwrap().len(), 2);
        assert!(
            next.ca_crt.ends_with(&pem_cert(
                &CertificateDer::pem_slice_iter(old.ca_crt.as_bytes())
                    .next()
                    .unwrap()
                    .unwrap()
            ))
        );
        assert!(next.certified_key().is_ok());
    }

    #[test]
    fn a_renamed_service_gets_a_new_certificate() {
        let s = settings(86400, 3600);
        let now = SystemTime::now();
        let b = CertBundle::generate(&s, now).unwrap();
        assert_eq!(dns_names(&b.tls_crt).unwrap(), s.dns_names());
        assert_eq!(b.rotated(&s, now).unwrap(), None);
        let mut renamed = s.clone();
        renamed.service_name = "other".into();
        let next = b.rotated(&renamed, now).unwrap().unwrap();
        assert_eq!(dns_names(&next.tls_crt).unwrap(), renamed.dns_names());
        assert_eq!(next.ca_crt, b.ca_crt, "same CA");
    }

    #[test]
    fn garbage_is_replaced_not_fatal() {
        let b = CertBundle {
            ca_crt: "x".into(),
            ca_key: "y".into(),
            tls_crt: "z".into(),
            tls_key: "w".into(),
        };
        assert!(b.rotated(&settings(3600, 60), SystemTime::now()).is_err());
        assert!(b.certified_key().is_err());
    }

    const DAY: u64 = 86400;

    /// The serving Secret holds the serving pair and the CA bundle, never the CA key; the
    /// CA Secret holds the CA and its key.
    #[tokio::test]
    async fn the_ca_key_is_kept_apart_from_the_serving_pair() {
        let store = MemoryCertStore::default();
        let m = CertManager::new(
            store.clone(),
            settings(86400, 3600),
            Arc::new(CertResolver::default()),
        );
        let bundle = m.ensure().await.unwrap();
        let (serving, ca) = store.data().unwrap();
        let keys = |d: &BTreeMap<String, ByteString>| d.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&serving), ["ca.crt", "ca.key", "tls.crt", "tls.key"]);
        assert!(
            serving["ca.key"].0.is_empty(),
            "no CA key in the serving Secret"
        );
        assert_eq!(keys(&ca), ["ca.crt", "ca.key"]);
        assert_eq!(ca["ca.key"].0, bundle.ca_key.as_bytes());
    }

    /// A new CA lives as long as the settings say (a year by default, not ten), and its
    /// rotation overlaps: the old CA stays in the bundle while it is valid, the new leaf
    /// is signed by the new CA, and the old CA leaves the bundle once expired.
    #[test]
    fn a_one_year_ca_rotates_with_overlap() {
        let s = CertSettings {
            ca_validity: Duration::from_secs(365 * DAY),
            cert_validity: Duration::from_secs(90 * DAY),
            rotate_before: Duration::from_secs(30 * DAY),
            ..settings(0, 0)
        };
        let now = SystemTime::now();
        let first = CertBundle::generate(&s, now).unwrap();
        let ca_end = not_after(&first.ca_crt).unwrap()[0];
        let lifetime = ca_end.duration_since(now).unwrap().as_secs();
        assert!(
            (365 * DAY - 120..=365 * DAY).contains(&lifetime),
            "{lifetime}"
        );
        // A leaf rotation at 70 days keeps the CA.
        let day70 = now + Duration::from_secs(70 * DAY);
        let leaf = first.rotated(&s, day70).unwrap().unwrap();
        assert_eq!(leaf.ca_crt, first.ca_crt);
        // At 300 days a new leaf would outlive the CA's margin: a new CA, the old kept.
        let day300 = now + Duration::from_secs(300 * DAY);
        let next = leaf.rotated(&s, day300).unwrap().unwrap();
        assert_ne!(next.ca_key, first.ca_key);
        assert_eq!(not_after(&next.ca_crt).unwrap().len(), 2);
        assert!(issued_by(&next.tls_crt, &next.ca_crt));
        assert!(!issued_by(&next.tls_crt, &first.ca_crt));
        // Past the old CA's end, the next CA rotation drops it from the bundle.
        let day640 = now + Duration::from_secs(640 * DAY);
        let last = next.rotated(&s, day640).unwrap().unwrap();
        assert_eq!(not_after(&last.ca_crt).unwrap().len(), 2);
        assert!(!last.ca_crt.contains(first.ca_crt.trim()));
    }

    /// The serving Secret of an earlier release holds all four files and the CA Secret is
    /// empty (the chart just made it): the same CA and serving pair are kept (no new CA
    /// for the API server to learn), and the CA key is moved into the CA Secret.
    #[tokio::test]
    async fn the_single_secret_layout_is_migrated() {
        let s = settings(86400, 3600);
        let old = CertBundle::generate(&s, SystemTime::now()).unwrap();
        let single: BTreeMap<String, ByteString> = [
            ("ca.crt", &old.ca_crt),
            ("ca.key", &old.ca_key),
            ("tls.crt", &old.tls_crt),
            ("tls.key", &old.tls_key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
        // The chart's empty CA Secret.
        let empty: BTreeMap<String, ByteString> = BTreeMap::new();
        assert_eq!(
            CertBundle::from_secrets(Some(&single), Some(&empty)),
            (Some(old.clone()), true)
        );
        let store = MemoryCertStore::default();
        store.put_data((single, empty));
        let resolver = Arc::new(CertResolver::default());
        let m = CertManager::new(store.clone(), s, Arc::clone(&resolver));
        assert_eq!(m.ensure().await.unwrap(), old, "the same certificates");
        let (serving, ca) = store.data().unwrap();
        assert!(serving["ca.key"].0.is_empty(), "moved out");
        assert_eq!(ca["ca.key"].0, old.ca_key.as_bytes());
        assert_eq!(store.stored(), Some(old.clone()));
        assert_eq!(store.published(), std::slice::from_ref(&old.ca_crt));
        // Moved once: the next check writes nothing.
        let before = store.load().await.unwrap().unwrap().version;
        m.ensure().await.unwrap();
        assert_eq!(store.load().await.unwrap().unwrap().version, before);
        // An emptied CA Secret (after a suspected leak): a new CA, the old one not trusted.
        let (serving, _) = store.data().unwrap();
        store.put_data((serving, BTreeMap::new()));
        let fresh = m.ensure().await.unwrap();
        assert_ne!(fresh.ca_key, old.ca_key);
        assert!(!fresh.ca_crt.contains(old.ca_crt.trim()));
        assert!(issued_by(&fresh.tls_crt, &fresh.ca_crt));
    }

    /// A serving Secret whose leaf a previous CA signed (a crash between the CA Secret's
    /// write and the serving Secret's) gets a leaf of the current CA at once.
    #[test]
    fn a_leaf_of_another_ca_is_reissued() {
        let s = settings(86400, 3600);
        let now = SystemTime::now();
        let a = CertBundle::generate(&s, now).unwrap();
        let b = CertBundle::generate(&s, now).unwrap();
        let mixed = CertBundle {
            tls_crt: a.tls_crt.clone(),
            tls_key: a.tls_key.clone(),
            ..b.clone()
        };
        let next = mixed.rotated(&s, now).unwrap().unwrap();
        assert_eq!(next.ca_crt, b.ca_crt, "the CA stays");
        assert!(issued_by(&next.tls_crt, &b.ca_crt));
        // Neither Secret filled in: nothing to keep.
        assert_eq!(CertBundle::from_secrets(None, None), (None, false));
    }
}
