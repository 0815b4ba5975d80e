//! Certificates for a TLS test server, generated at test time (nothing checked in): a CA,
//! a server certificate for `localhost` and `127.0.0.1`, and a client certificate, both
//! signed by it.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};

use crate::testing::server::HarnessError;

/// The PEM files of a TLS test server.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA certificate (give it to clients as `cacert`).
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
    /// A client certificate signed by the same CA (give it to clients as `cert`).
    pub client_cert: PathBuf,
    /// The client certificate's private key (`key`).
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// Generates a CA, a server certificate and a client certificate into `dir`.
    pub fn generate(dir: &Path) -> Result<TlsFiles, HarnessError> {
        let fail = |e: rcgen::Error| HarnessError(format!("cannot generate test certificates: {e}"));
        let ca_key = KeyPair::generate().map_err(fail)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "rdzv test CA");
        let ca_cert = ca_params.self_signed(&ca_key).map_err(fail)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().map_err(fail)?;
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).map_err(fail)?;
        server_params.distinguished_name.push(DnType::CommonName, "localhost");
        let server_cert = server_params.signed_by(&server_key, &issuer).map_err(fail)?;

        let client_key = KeyPair::generate().map_err(fail)?;
        let mut client_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        client_params.distinguished_name.push(DnType::CommonName, "rdzv test client");
        client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client_params.signed_by(&client_key, &issuer).map_err(fail)?;

        let files = TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        };
        for (path, pem) in [
            (&files.ca, ca_cert.pem()),
            (&files.cert, server_cert.pem()),
            (&files.key, server_key.serialize_pem()),
            (&files.client_cert, client_cert.pem()),
            (&files.client_key, client_key.serialize_pem()),
        ] {
            std::fs::write(path, pem)
                .map_err(|e| HarnessError(format!("cannot write {}: {e}", path.display())))?;
        }
        Ok(files)
    }
}
