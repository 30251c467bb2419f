//! Certificates for one test cluster: a CA, the API server's serving certificate for
//! `localhost`/`127.0.0.1`, and an admin client certificate in `system:masters`.

use std::fs;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// PEM files of one cluster.
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate (trust root for the server and the client certificate).
    pub ca_cert: String,
    /// Admin client certificate.
    pub admin_cert: String,
    /// Admin client key.
    pub admin_key: String,
}

/// Generate the certificates and write them under `dir` (`ca.crt`, `server.crt`,
/// `server.key`, `admin.crt`, `admin.key`).
pub fn generate(dir: &Path) -> anyhow::Result<Pki> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kubeairunway-testcluster-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut server_params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate()?;
    let server_cert = server_params.signed_by(&server_key, &ca)?;

    let mut admin_params = CertificateParams::new(Vec::<String>::new())?;
    admin_params
        .distinguished_name
        .push(DnType::CommonName, "testcluster-admin");
    admin_params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_key = KeyPair::generate()?;
    let admin_cert = admin_params.signed_by(&admin_key, &ca)?;

    fs::create_dir_all(dir)?;
    let pki = Pki {
        ca_cert: ca.pem(),
        admin_cert: admin_cert.pem(),
        admin_key: admin_key.serialize_pem(),
    };
    fs::write(dir.join("ca.crt"), &pki.ca_cert)?;
    fs::write(dir.join("server.crt"), server_cert.pem())?;
    fs::write(dir.join("server.key"), server_key.serialize_pem())?;
    fs::write(dir.join("admin.crt"), &pki.admin_cert)?;
    fs::write(dir.join("admin.key"), &pki.admin_key)?;
    Ok(pki)
}
