//! TLS for both ends: the harness's client configuration (system roots, a private CA, or no
//! verification at all) and the reference server's certificate, generated at start.
//!
//! rustls with the *ring* provider: no OpenSSL, no system library, the same behaviour on
//! every machine. The harness speaks HTTP/1.1 only, so both ends offer ALPN `http/1.1`.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// ALPN protocol both ends agree on.
const HTTP11: &[u8] = b"http/1.1";

/// Which server certificates the harness trusts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Trust {
    /// The operating system's root certificates.
    #[default]
    System,
    /// Only these certificate authorities (`--cacert`).
    Authorities(Vec<CertificateDer<'static>>),
    /// Any certificate: verification is skipped (`--insecure`). The handshake's own
    /// signatures are still checked, so the connection is at least not garbled.
    Insecure,
}

impl Trust {
    /// The authorities in PEM file `path` (one or more `CERTIFICATE` blocks).
    pub fn from_pem_file(path: &Path) -> Result<Trust, String> {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("--cacert {}: {e}", path.display()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--cacert {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "--cacert {}: no PEM CERTIFICATE block in the file",
                path.display()
            ));
        }
        Ok(Trust::Authorities(certs))
    }

    /// How the report header describes it.
    pub fn describe(&self) -> &'static str {
        match self {
            Trust::System => "system roots",
            Trust::Authorities(_) => "--cacert",
            Trust::Insecure => "INSECURE: certificates not verified",
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// The client configuration for `trust`.
pub fn client_config(trust: &Trust) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let mut config = match trust {
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth(),
        Trust::System | Trust::Authorities(_) => {
            let mut roots = RootCertStore::empty();
            let (added, ignored) = match trust {
                Trust::Authorities(certs) => roots.add_parsable_certificates(certs.iter().cloned()),
                _ => {
                    let found = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(found.certs)
                }
            };
            if added == 0 {
                return Err(match trust {
                    Trust::Authorities(_) => format!(
                        "--cacert: none of its {ignored} certificate(s) can serve as a trust anchor"
                    ),
                    _ => {
                        "no system root certificates were found: give --cacert FILE (or --insecure)"
                            .into()
                    }
                });
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// `--insecure`: every certificate is accepted; the handshake signatures are verified with
/// the provider's algorithms so that a broken peer still fails.
#[derive(Debug)]
struct AcceptAny(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// A certificate authority and a server certificate it signed, made at start.
#[derive(Clone)]
pub struct Identity {
    /// The authority's certificate: what a client must trust.
    pub ca: CertificateDer<'static>,
    /// The authority's certificate as PEM, for `--cacert`.
    pub ca_pem: String,
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

impl Identity {
    /// A fresh authority, and a certificate for `localhost`, `127.0.0.1` and `::1` signed
    /// by it. Keys live in memory only; nothing but the authority's certificate is written
    /// anywhere.
    pub fn generate() -> Result<Identity, String> {
        let err = |e: rcgen::Error| format!("cannot generate the TLS certificate: {e}");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "idem-conformance test CA");
        let ca_key = rcgen::KeyPair::generate().map_err(err)?;
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(err)?;

        let names = ["localhost", "127.0.0.1", "::1"].map(str::to_owned);
        let mut leaf_params = rcgen::CertificateParams::new(names.to_vec()).map_err(err)?;
        leaf_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "idem reference server");
        leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = rcgen::KeyPair::generate().map_err(err)?;
        let leaf = leaf_params.signed_by(&leaf_key, &ca).map_err(err)?;

        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
            .map_err(|e| format!("TLS setup: {e}"))?;
        config.alpn_protocols = vec![HTTP11.to_vec()];
        Ok(Identity {
            ca: ca.der().clone(),
            ca_pem: ca.pem(),
            config: Arc::new(config),
        })
    }

    /// The server configuration.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.config)
    }

    /// Writes the authority's certificate to `dir/ca.pem` (creating `dir`) and returns the
    /// path.
    pub fn write_ca(&self, dir: &Path) -> Result<PathBuf, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("ca.pem");
        std::fs::write(&path, &self.ca_pem).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// Trust in this authority alone.
    pub fn trust(&self) -> Trust {
        Trust::Authorities(vec![self.ca.clone()])
    }
}
