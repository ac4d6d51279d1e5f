//! TLS termination (`[tls]`, docs/design.md "Configuration"): rustls with the `ring`
//! provider, ALPN `h2` then `http/1.1` (RFC 7301; RFC 9113 §3.2), TLS 1.2 (RFC 5246) and 1.3
//! (RFC 8446) or 1.3 only.
//!
//! [`load`] reads and checks the certificate chain and key before anything is bound, so a bad
//! or missing pair stops start-up with an error naming the file.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    sign::CertifiedKey,
};
use thiserror::Error;

use crate::config::{TlsConfig, TlsVersion};

/// The ALPN protocols door offers, most preferred first.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why the TLS configuration cannot be used; every variant names the file.
#[derive(Debug, Error)]
pub enum TlsError {
    /// `tls.cert` or `tls.key` could not be opened or read (missing, not permitted, an I/O
    /// error): a file that may yet appear, such as a credential systemd provides only to the
    /// running unit, or a certificate a renewal has not written yet.
    #[error("{key} = {path:?}: {source}")]
    Read {
        /// `tls.cert` or `tls.key`.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `tls.cert` is larger than [`MAX_PEM_FILE`] or holds no PEM certificate.
    #[error("tls.cert = {path:?}: {reason}")]
    Cert {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `tls.key` is larger than [`MAX_PEM_FILE`] or holds no usable PEM private key.
    #[error("tls.key = {path:?}: {reason}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key does not belong to the certificate, or rustls refused the pair.
    #[error("tls.key = {key:?} does not fit tls.cert = {cert:?}: {reason}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        reason: String,
    },
}

/// The largest certificate or key file door reads, in bytes: 1 MiB. A chain of a few
/// certificates in PEM is a few KiB; a path to something else (`/dev/zero`, a log) must not be
/// read without end.
pub const MAX_PEM_FILE: u64 = 1024 * 1024;

/// Reads the PEM file at `path` whole (a certificate chain, a key, `cluster.ca_file`'s CAs):
/// [`crate::config::bounded::read`], at most [`MAX_PEM_FILE`] bytes.
///
/// # Errors
///
/// The I/O error; [`std::io::ErrorKind::FileTooLarge`] past [`MAX_PEM_FILE`] bytes, and
/// [`std::io::ErrorKind::InvalidInput`] for anything but a regular file ([`is_unusable`] says
/// both).
pub fn read_pem_file(path: &Path) -> std::io::Result<Vec<u8>> {
    crate::config::bounded::read(path, MAX_PEM_FILE)
}

/// Whether a [`read_pem_file`] error says the path can never hold a PEM file (too large, or not
/// a regular file: a FIFO, a socket, a device, a directory), rather than that it cannot be read
/// now (missing, not permitted).
pub fn is_unusable(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::FileTooLarge | std::io::ErrorKind::InvalidInput
    )
}

/// Reads `key`'s file at `path` ([`read_pem_file`]): [`TlsError::Read`] when it cannot be read,
/// `unusable` when it can never be a PEM file ([`is_unusable`]).
fn read_pair_file(
    key: &'static str,
    path: &Path,
    unusable: impl FnOnce(String) -> TlsError,
) -> Result<Vec<u8>, TlsError> {
    read_pem_file(path).map_err(|source| {
        if is_unusable(&source) {
            unusable(source.to_string())
        } else {
            TlsError::Read {
                key,
                path: path.to_owned(),
                source,
            }
        }
    })
}

/// Builds the rustls server configuration of `cfg`: reads the PEM chain and key (at most
/// [`MAX_PEM_FILE`] bytes each), checks that the key signs for the leaf certificate, restricts
/// the protocol versions and offers ALPN [`ALPN`].
///
/// # Errors
/// [`TlsError`] naming the certificate or key file: [`TlsError::Read`] when one cannot be read,
/// the other variants when what it holds cannot be used.
pub fn load(cfg: &TlsConfig) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_err = |reason: String| TlsError::Cert {
        path: cfg.cert.clone(),
        reason,
    };
    let pem = read_pair_file("tls.cert", &cfg.cert, cert_err)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(cert_err("no PEM CERTIFICATE block".to_owned()));
    }
    let key_err = |reason: String| TlsError::Key {
        path: cfg.key.clone(),
        reason,
    };
    let pem = read_pair_file("tls.key", &cfg.key, key_err)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| key_err(e.to_string()))?;
    let mismatch = |reason: String| TlsError::Mismatch {
        cert: cfg.cert.clone(),
        key: cfg.key.clone(),
        reason,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Checks that the key parses and that its public key is the leaf certificate's.
    CertifiedKey::from_der(certs.clone(), key.clone_key(), &provider)
        .map_err(|e| mismatch(e.to_string()))?;
    let versions: &[&rustls::SupportedProtocolVersion] = match cfg.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let mut config = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .map_err(|e| mismatch(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| mismatch(e.to_string()))?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
