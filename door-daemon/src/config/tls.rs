//! TLS termination (`[tls]`): the certificate, the key and the lowest protocol version.

use std::path::PathBuf;

use super::{ConfigError, file::TlsFile, flags::Overrides, invalid};

/// The lowest TLS protocol version door accepts (`[tls] min_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2 (RFC 5246) and 1.3: the default.
    Tls12,
    /// TLS 1.3 (RFC 8446) only.
    Tls13,
}

impl TlsVersion {
    /// `"1.2"` or `"1.3"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tls12 => "1.2",
            Self::Tls13 => "1.3",
        }
    }
}

/// TLS termination (`[tls]`): ALPN `h2` and `http/1.1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first (`tls.cert`; `--tls-cert` / `DOOR_TLS_CERT`).
    pub cert: PathBuf,
    /// PEM private key: PKCS#8, PKCS#1 or SEC1 (`tls.key`; `--tls-key` / `DOOR_TLS_KEY`).
    pub key: PathBuf,
    /// Lowest protocol version (`tls.min_version = "1.2" | "1.3"`; `--tls-min-version` /
    /// `DOOR_TLS_MIN_VERSION`). Default `"1.2"`.
    pub min_version: TlsVersion,
}

pub(super) fn build_tls(
    file: Option<TlsFile>,
    o: &Overrides,
) -> Result<Option<TlsConfig>, ConfigError> {
    let f = file.unwrap_or_default();
    let cert = o.tls_cert.clone().or(f.cert);
    let key = o.tls_key.clone().or(f.key);
    let min_raw = o.tls_min_version.clone().or(f.min_version);
    let (cert, key) = match (cert, key) {
        (None, None) => {
            if let Some(v) = min_raw {
                return Err(invalid(
                    "tls.min_version",
                    format!("{v:?}"),
                    "needs tls.cert and tls.key",
                ));
            }
            return Ok(None);
        }
        (Some(_), None) => return Err(invalid("tls.key", "(none)", "required with tls.cert")),
        (None, Some(_)) => return Err(invalid("tls.cert", "(none)", "required with tls.key")),
        (Some(c), Some(k)) => (c, k),
    };
    for (k, v) in [("tls.cert", &cert), ("tls.key", &key)] {
        if v.is_empty() {
            return Err(invalid(k, "\"\"", "must be a file path"));
        }
    }
    let min_version = match min_raw.as_deref() {
        None | Some("1.2") => TlsVersion::Tls12,
        Some("1.3") => TlsVersion::Tls13,
        Some(v) => {
            return Err(invalid(
                "tls.min_version",
                format!("{v:?}"),
                "must be \"1.2\" or \"1.3\"",
            ));
        }
    };
    Ok(Some(TlsConfig {
        cert: PathBuf::from(cert),
        key: PathBuf::from(key),
        min_version,
    }))
}
