//! Certificates generated at test time (never checked in): a CA, a server certificate (for
//! `127.0.0.1`/`localhost`, or names of the test's choice) and a client certificate signed
//! by it, plus an unrelated CA for "wrong CA" tests.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::HarnessError;
use crate::config::TlsFiles;

/// The PEM files of a TLS test setup, all in one directory.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// The CA that signed the server and client certificates.
    pub ca_cert: PathBuf,
    /// The server's certificate (for [`TlsMaterial::server_names`]).
    pub server_cert: PathBuf,
    /// The names the server's certificate is issued to (`127.0.0.1` and `localhost` unless
    /// chosen otherwise).
    pub server_names: Vec<String>,
    /// The server certificate's key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA (CN `root`).
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
    /// A CA that signed nothing here: trusting it instead of `ca_cert` must fail.
    pub other_ca_cert: PathBuf,
}

impl TlsMaterial {
    /// Generates the certificates into `dir`, the server's for `127.0.0.1` and `localhost`.
    pub fn generate(dir: &Path) -> Result<TlsMaterial, HarnessError> {
        TlsMaterial::generate_for(dir, &["127.0.0.1".to_string(), "localhost".to_string()])
    }

    /// Generates the certificates into `dir`, the server's for `server_names` (at least one)
    /// only.
    pub fn generate_for(dir: &Path, server_names: &[String]) -> Result<TlsMaterial, HarnessError> {
        let Some(first) = server_names.first() else {
            return Err(HarnessError::new("a server certificate needs at least one name"));
        };
        let (ca_pem, issuer) = ca("rdzv test CA")?;
        let (other_ca_pem, _) = ca("rdzv unrelated CA")?;
        let (server_pem, server_key) = leaf(
            &issuer,
            first,
            server_names.to_vec(),
            // etcd's built-in gRPC gateway dials the server with the server's certificate.
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let (client_pem, client_key) =
            leaf(&issuer, "root", Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth])?;
        let write = |name: &str, contents: &str| -> Result<PathBuf, HarnessError> {
            let path = dir.join(name);
            std::fs::write(&path, contents)
                .map_err(|e| HarnessError::new(format!("cannot write {}: {e}", path.display())))?;
            Ok(path)
        };
        Ok(TlsMaterial {
            ca_cert: write("ca.pem", &ca_pem)?,
            server_cert: write("server.pem", &server_pem)?,
            server_names: server_names.to_vec(),
            server_key: write("server.key", &server_key)?,
            client_cert: write("client.pem", &client_pem)?,
            client_key: write("client.key", &client_key)?,
            other_ca_cert: write("other-ca.pem", &other_ca_pem)?,
        })
    }

    /// Client TLS settings that connect to `127.0.0.1`: trusting the right CA, presenting
    /// the client certificate, and expecting the server's first name when its certificate
    /// is not issued to `127.0.0.1`.
    pub fn client_files(&self) -> TlsFiles {
        let by_address = self.server_names.iter().any(|name| name == "127.0.0.1");
        TlsFiles {
            ca_cert: Some(self.ca_cert.clone()),
            client_cert: Some(self.client_cert.clone()),
            client_key: Some(self.client_key.clone()),
            server_name: if by_address { None } else { self.server_names.first().cloned() },
        }
    }
}

fn rcgen_error(e: rcgen::Error) -> HarnessError {
    HarnessError::new(format!("cannot generate a test certificate: {e}"))
}

fn ca(name: &str) -> Result<(String, Issuer<'static, KeyPair>), HarnessError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages =
        vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let cert = params.self_signed(&key).map_err(rcgen_error)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    common_name: &str,
    alt_names: Vec<String>,
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> Result<(String, String), HarnessError> {
    let mut params = CertificateParams::new(alt_names).map_err(rcgen_error)?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = usages;
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let cert = params.signed_by(&key, issuer).map_err(rcgen_error)?;
    Ok((cert.pem(), key.serialize_pem()))
}
