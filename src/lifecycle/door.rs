//! Closing a listening socket without resetting anyone. The kernel completes handshakes on
//! its own and queues the connections until they are accepted; closing the socket resets
//! every queued connection, although its client has already sent a request. So at shutdown
//! new SYNs are dropped first (a dropped SYN is retransmitted, and by then the port refuses),
//! the queue is accepted and served, and only then does the socket leave LISTEN.

use std::io;
use std::net::{Shutdown, TcpListener};
use std::os::fd::AsRawFd;

use socket2::Socket;

/// A second descriptor of a listening socket that actix serves, kept for the shutdown.
pub struct Door(Socket);

impl Door {
    pub fn of(listener: &TcpListener) -> io::Result<Door> {
        Ok(Door(Socket::from(listener.try_clone()?)))
    }

    /// From now on the kernel drops new SYNs; handshakes already under way still complete
    /// and wait in the accept queue. Only Linux has socket filters; elsewhere a no-op.
    pub fn hold_new_connections(&self) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        self.0.attach_filter(&drop_syn_filter())?;
        Ok(())
    }

    /// Whether connections wait in the accept queue: a listening socket polls readable then.
    pub fn has_waiting(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd that outlives the call; a zero timeout never blocks.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0 && poll.revents & libc::POLLIN != 0
    }

    /// Takes the socket out of LISTEN: the kernel answers new SYNs with a reset, which the
    /// client sees as "connection refused". Connections still queued are reset, so call this
    /// once [`Door::has_waiting`] is false and nothing accepts anymore.
    pub fn shut(&self) -> io::Result<()> {
        self.0.shutdown(Shutdown::Read)
    }
}

/// Classic BPF run on each segment that reaches the listener, with the TCP header at offset
/// 0: drop it (return 0) if SYN is set and ACK is not, keep it whole otherwise.
#[cfg(target_os = "linux")]
fn drop_syn_filter() -> [socket2::SockFilter; 5] {
    use socket2::SockFilter;
    const LOAD_BYTE_AT: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const AND: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
    const JUMP_IF_EQUAL: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RETURN: u16 = 0x06; // BPF_RET | BPF_K
    const TCP_FLAGS: u32 = 13;
    const SYN: u32 = 0x02;
    const ACK: u32 = 0x10;
    [
        SockFilter::new(LOAD_BYTE_AT, 0, 0, TCP_FLAGS),
        SockFilter::new(AND, 0, 0, SYN | ACK),
        SockFilter::new(JUMP_IF_EQUAL, 0, 1, SYN),
        SockFilter::new(RETURN, 0, 0, 0),
        SockFilter::new(RETURN, 0, 0, u32::MAX),
    ]
}
