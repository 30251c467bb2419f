//! Certificates for one test cluster: a CA, the API server's serving certificate for
//! `localhost`/`127.0.0.1`, an admin client certificate in `system:masters`, and client
//! certificates for any other identity ([`issue_client`]): the API server takes the
//! common name as the user name and each organization as a group, as kube-apiserver does.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
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
/// `server.key`, `admin.crt`, `admin.key`; `ca.key` to issue more client certificates).
pub fn generate(dir: &Path) -> anyhow::Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params()?, ca_key)?;

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
    fs::write(dir.join("ca.key"), ca_key_pem)?;
    fs::write(dir.join("server.crt"), server_cert.pem())?;
    fs::write(dir.join("server.key"), server_key.serialize_pem())?;
    fs::write(dir.join("admin.crt"), &pki.admin_cert)?;
    fs::write(dir.join("admin.key"), &pki.admin_key)?;
    Ok(pki)
}

fn ca_params() -> anyhow::Result<CertificateParams> {
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
    Ok(ca_params)
}

/// Issue a client certificate for `user` (in `group`, when given: rcgen writes one
/// organization per name), signed by the CA under `dir`, and write it as
/// `<file_stem>.crt` and `<file_stem>.key` there. Returns both paths.
pub fn issue_client(
    dir: &Path,
    file_stem: &str,
    user: &str,
    group: Option<&str>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let ca_key = KeyPair::from_pem(&fs::read_to_string(dir.join("ca.key"))?)?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    if let Some(group) = group {
        params
            .distinguished_name
            .push(DnType::OrganizationName, group);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let (crt, key_path) = (
        dir.join(format!("{file_stem}.crt")),
        dir.join(format!("{file_stem}.key")),
    );
    fs::write(&crt, cert.pem())?;
    fs::write(&key_path, key.serialize_pem())?;
    Ok((crt, key_path))
}
