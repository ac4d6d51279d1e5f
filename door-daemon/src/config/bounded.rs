//! Reading a file the operator names (the configuration, a certificate, a key, a CA bundle):
//! whole, bounded in size, and without waiting on anything that is not a regular file. A path
//! to a FIFO would otherwise hold the reader until something writes to it (a reload, and the
//! signals queued behind it, SIGTERM among them), and one to `/dev/zero` or a growing log would
//! be read without end (found by hostile testing).

use std::{
    io::{self, Read as _},
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
};

/// Reads the regular file at `path` (a symbolic link is followed) whole, at most `max` bytes.
/// What `path` names is looked at before it is opened, so that nothing else is ever opened (a
/// device's open can act: `/dev/watchdog` arms a watchdog), and opened without waiting
/// (`O_NONBLOCK`) nor taking a terminal (`O_NOCTTY`), and looked at again, in case the path was
/// changed in between.
///
/// # Errors
///
/// The I/O error of opening or reading it; [`io::ErrorKind::InvalidInput`] when it is not a
/// regular file (a FIFO, a socket, a device, a directory), and [`io::ErrorKind::FileTooLarge`]
/// when it holds more than `max` bytes.
pub fn read(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let not_a_file = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, a socket, a device or a directory): reading it could wait for a writer or never end",
        )
    };
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_a_file());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_a_file());
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A directory of its own for test `name`, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("door-bounded-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_regular_file_is_read_whole_up_to_the_bound() {
        let dir = Dir::new("regular");
        let path = dir.path().join("door.toml");
        std::fs::write(&path, b"listen = []\n").unwrap();
        assert_eq!(read(&path, 12).unwrap(), b"listen = []\n");
        let too_large = read(&path, 11).unwrap_err();
        assert_eq!(too_large.kind(), io::ErrorKind::FileTooLarge);
        assert!(too_large.to_string().contains("larger than 11 bytes"));
    }

    /// A FIFO is refused at once, not waited on; so are a device and a directory, and a symbolic
    /// link is followed to what it names.
    #[test]
    fn a_fifo_a_device_and_a_directory_are_refused_without_waiting() {
        let dir = Dir::new("special");
        let fifo = dir.path().join("fifo");
        // std makes no FIFO: coreutils' mkfifo does.
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        for path in [fifo.as_path(), Path::new("/dev/zero"), &link, dir.path()] {
            let e = read(path, 1024).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}", path.display());
        }
    }
}
