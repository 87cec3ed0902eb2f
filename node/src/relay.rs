//! Moving a proxied connection's bytes both ways between two sockets,
//! once the proxy or the ingress gateway has connected them (`forward`).
//!
//! Each direction starts as a copy through a 64 KiB buffer in user space,
//! which costs nothing to set up and keeps a small request's round trip
//! at one read and one write. A direction whose read fills the whole
//! buffer carries bulk data: on Linux it switches to `splice(2)` through a
//! pipe of its own, so the kernel moves the pages from one socket to the
//! other without copying them into this process (HAProxy's "splice
//! auto"). A direction never switches back, and one whose kernel refuses
//! splice (or that cannot get a pipe) stays a copy. Small connections thus
//! never hold a pipe's two descriptors.
//!
//! When one side ends its writes, the other side's writes are shut down
//! and the other direction goes on until it ends too, as
//! `tokio::io::copy_bidirectional` does. This module decides nothing about
//! where bytes go and never retries: it only carries.

use std::io;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The user-space buffer of a direction: large enough that bulk moves in
/// few syscalls (tokio's default is 8 KiB); a read that fills it switches
/// the direction to splice.
const COPY_BUFFER: usize = 64 * 1024;

/// Copies both ways until both directions ended (or either failed);
/// answers the bytes carried from `a` to `b` and from `b` to `a`.
pub(crate) async fn relay(a: &TcpStream, b: &TcpStream) -> io::Result<(u64, u64)> {
    tokio::try_join!(one_way(a, b), one_way(b, a))
}

/// Carries `src`'s bytes to `dst` until `src` ends its writes, then shuts
/// down `dst`'s writes.
async fn one_way(src: &TcpStream, dst: &TcpStream) -> io::Result<u64> {
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut total = 0u64;
    #[cfg(target_os = "linux")]
    let mut pipe: Option<splice::Pipe> = None;
    #[cfg(target_os = "linux")]
    let mut splice_refused = false;
    loop {
        #[cfg(target_os = "linux")]
        if let Some(p) = &pipe {
            match p.carry(src, dst).await {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    continue;
                }
                // Nothing moved: the kernel does not splice these sockets.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !splice_refused => {
                    tracing::debug!(error = %e, "splice refused; copying in user space");
                    splice_refused = true;
                    pipe = None;
                }
                Err(e) => return Err(e),
            }
        }
        let n = read(src, &mut buf).await?;
        if n == 0 {
            break;
        }
        write_all(dst, &buf[..n]).await?;
        total += n as u64;
        #[cfg(target_os = "linux")]
        if n == buf.len() && pipe.is_none() && !splice_refused {
            pipe = splice::Pipe::new()
                .inspect_err(
                    |e| tracing::debug!(error = %e, "no pipe for splice; copying in user space"),
                )
                .ok();
        }
    }
    shutdown_writes(dst)?;
    Ok(total)
}

async fn read(src: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        src.readable().await?;
        match src.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

async fn write_all(dst: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        dst.writable().await?;
        match dst.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Ends `dst`'s writes (a FIN to its peer); its reads go on. A peer that
/// is already gone is not an error here: the other direction sees it.
fn shutdown_writes(dst: &TcpStream) -> io::Result<()> {
    match socket_shutdown_write(dst) {
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
        other => other,
    }
}

#[cfg(unix)]
fn socket_shutdown_write(s: &TcpStream) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: shutdown(2) on a descriptor `s` owns and keeps open.
    let rc = unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_WR) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn socket_shutdown_write(_s: &TcpStream) -> io::Result<()> {
    Ok(())
}

#[cfg(target_os = "linux")]
mod splice {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

    use super::{Interest, TcpStream};

    /// The most one splice moves.
    const CHUNK: usize = 1 << 20;

    /// The pipe size asked for (the kernel's default is 64 KiB).
    const PIPE_BYTES: libc::c_int = 1 << 20;

    /// A non-blocking pipe one direction splices through.
    pub(super) struct Pipe {
        read: OwnedFd,
        write: OwnedFd,
    }

    impl Pipe {
        pub(super) fn new() -> io::Result<Pipe> {
            let mut fds = [0 as RawFd; 2];
            // SAFETY: pipe2(2) writes two descriptors into `fds`, which
            // are owned below and closed on drop.
            let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: both descriptors were just created and are owned
            // by nothing else.
            let (read, write) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            // A larger pipe moves more per splice. Refused (over the
            // user's pipe budget), the default 64 KiB still works.
            // SAFETY: fcntl(2) on a descriptor owned here.
            let _ = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
            Ok(Pipe { read, write })
        }

        /// Moves what `src` has (once it has something) into the pipe and
        /// all of it on to `dst`; answers how many bytes, 0 when `src`
        /// ended its writes. The pipe is empty before and after.
        pub(super) async fn carry(&self, src: &TcpStream, dst: &TcpStream) -> io::Result<usize> {
            let n = loop {
                src.readable().await?;
                let moved = src.try_io(Interest::READABLE, || {
                    splice(src.as_raw_fd(), self.write.as_raw_fd(), CHUNK)
                });
                match moved {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    other => break other?,
                }
            };
            let mut left = n;
            while left > 0 {
                dst.writable().await?;
                let moved = dst.try_io(Interest::WRITABLE, || {
                    splice(self.read.as_raw_fd(), dst.as_raw_fd(), left)
                });
                match moved {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            Ok(n)
        }
    }

    /// One splice(2) between two descriptors, neither blocking.
    fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
        // SAFETY: splice(2) between descriptors the callers keep open,
        // with no offsets (sockets and pipes have none).
        let rc = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Two connected sockets and the peer of each: `(a, a_peer, b, b_peer)`.
    async fn pairs() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let a_peer = TcpStream::connect(addr).await.unwrap();
        let (a, _) = listener.accept().await.unwrap();
        let b_peer = TcpStream::connect(addr).await.unwrap();
        let (b, _) = listener.accept().await.unwrap();
        (a, a_peer, b, b_peer)
    }

    /// Bulk one way (spliced after the first full buffer), a small answer
    /// the other way (copied), and each side's end of writes carried as
    /// a FIN: every byte arrives, in order, counted.
    #[tokio::test]
    async fn carries_bulk_and_small_both_ways_and_half_closes() {
        let (a, mut client, b, mut backend) = pairs().await;
        let relay = tokio::spawn(async move { relay(&a, &b).await });
        let bulk: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
        let sent = bulk.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            client
        });
        let mut got = Vec::new();
        backend.read_to_end(&mut got).await.unwrap();
        assert!(got == bulk, "the bulk direction arrived whole and in order");
        backend.write_all(b"done").await.unwrap();
        backend.shutdown().await.unwrap();
        let mut client = writer.await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"done");
        let (up, down) = relay.await.unwrap().unwrap();
        assert_eq!((up, down), (bulk.len() as u64, 4));
    }
}
