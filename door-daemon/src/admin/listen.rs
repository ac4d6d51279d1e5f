//! The admin listener's socket (`admin_listen`): a TCP address, or a Unix socket created with
//! mode 0600 and removed on exit.

use std::{
    io,
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use tokio::net::{TcpListener, UnixListener};

use crate::config::AdminListen;

/// A bound admin listener.
#[derive(Debug)]
pub enum AdminListener {
    /// On a TCP address.
    Tcp(TcpListener),
    /// On a Unix socket.
    Unix(UnixListener),
}

/// The Unix socket file of an [`AdminListener::Unix`]: removed when this value is dropped (keep
/// it for as long as door serves).
#[derive(Debug)]
pub struct SocketFile(PathBuf);

impl SocketFile {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove the admin socket");
        }
    }
}

impl AdminListener {
    /// Binds `at`. A Unix socket is created with mode 0600 (a socket's connecting side needs
    /// write permission, so nobody but its owner, and root, can connect); a stale socket file
    /// left by a door that died is replaced, a live one (something accepts on it) is not. Returns
    /// the socket file to keep, for a Unix socket. A TCP address is bound as door's `listen`
    /// addresses are ([`crate::http::bind::tcp`]), IPv6 only with `v6_only`.
    ///
    /// # Errors
    /// The bind's I/O error; `AddrInUse` when another process serves the Unix socket;
    /// `AlreadyExists` when the path is a file that is not a socket.
    pub fn bind(at: &AdminListen, v6_only: bool) -> io::Result<(Self, Option<SocketFile>)> {
        match at {
            AdminListen::Tcp(addr) => {
                Ok((Self::Tcp(crate::http::bind::tcp(*addr, v6_only)?), None))
            }
            AdminListen::Unix(path) => {
                match std::fs::symlink_metadata(path) {
                    Ok(m) if m.file_type().is_socket() => {
                        if std::os::unix::net::UnixStream::connect(path).is_ok() {
                            return Err(io::Error::new(
                                io::ErrorKind::AddrInUse,
                                "another process accepts on this socket",
                            ));
                        }
                        std::fs::remove_file(path)?;
                    }
                    Ok(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            "the path exists and is not a socket",
                        ));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                let listener = UnixListener::bind(path)?;
                let file = SocketFile(path.clone());
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                Ok((Self::Unix(listener), Some(file)))
            }
        }
    }

    /// Where it listens, for log lines: `http://127.0.0.1:9901` or `unix:/run/door/admin.sock`.
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map_or_else(|e| format!("tcp ({e})"), |a| format!("http://{a}")),
            Self::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_owned))
                .map_or_else(
                    || "unix socket".to_owned(),
                    |p| format!("unix:{}", p.display()),
                ),
        }
    }
}
