//! accept(): taking a connection canald (or a co-resident peer) queued on a listener.
use crate::conn::accept_sleep::Twin;
use crate::conn::request::attention;
use crate::conn::wait::wait_accept;
use crate::conn::wait::Wait;
use crate::fdtable::TABLE;
use crate::ready::SockState;
use crate::sock::core::dead_err;
use crate::sock::core::wait_err;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::addr::CanalAddr;
use canal_abi::addr::ADDR_SIZE;
use canal_abi::ring::record_kind;
use canal_abi::ring::Consumer;
use canal_abi::ring::RawRing;
use canal_abi::ring::RecordInfo;
use canal_abi::sock_flag as f;
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;
use libc::c_int;

/// accept/accept4: returns the new descriptor and the peer address.
/// Not an errno: `accept`'s answer when the listener was passed on by another process
/// of the guest (HANDED_OVER) while it looked or waited; the hook follows it to the
/// kernel socket and accepts there.
pub(crate) const HANDED_OVER: i32 = -1;

/// A blocked accept on a NATIVE_ACCEPT listener polls its twin every this many spins.
const TWIN_EVERY: u32 = 8;

pub(crate) fn accept(s: Sock, flags: c_int) -> Result<(c_int, Option<CanalAddr>), i32> {
    if s.kind() != sock_kind::LISTENER {
        dead_err(s.g, false)?;
        return Err(if s.kind() == sock_kind::DGRAM {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        });
    }
    let nonblock = s.nonblocking();
    let ring = s.rx_ring()?;
    let mut deadline = None;
    loop {
        crate::sock::dead::check(
            &s,
            false,
            nonblock,
            *deadline.get_or_insert_with(|| s.deadline(true)),
        )?;
        s.live()?;
        let held = crate::shortcut::sidelock::enter_rx(s.e);
        let mut c = Consumer {
            storage: &ring,
            head_shared: &s.e.rx_head,
            tail_shared: &s.e.rx_tail,
            tail: s.e.rx_tail.load(Ordering::Relaxed),
        };
        let out: Option<Result<(c_int, Option<CanalAddr>), i32>> = match c.next_record() {
            Err(_) => Some(Err(libc::EIO)),
            Ok(None) => None,
            Ok(Some(info))
                if info.kind != record_kind::ACCEPT
                    || (info.len as usize) < canal_abi::ACCEPT_PAYLOAD =>
            {
                c.consume_record(&info);
                None
            }
            Ok(Some(info)) => Some(take_record(&s, &mut c, &info, flags)),
        };
        crate::shortcut::sidelock::exit_rx(s.e, held);
        if canal_abi::region::room_asked_after_release(&s.e.flags) {
            attention(s.g, s.idx);
        }
        match out {
            Some(Err(libc::ECONNABORTED)) => continue,
            Some(r) => {
                if let Ok((fd, _)) = &r {
                    crate::rt::debug!(s.g, "canal: accept on handle {:#x} -> fd {fd}\n", s.handle);
                    if crate::sock::native::applies(s.flags()) {
                        crate::sock::native::note_client(s.handle, false);
                        native_client_left(&s);
                    }
                }
                return r;
            }
            None => {
                if s.e.rx_head.load(Ordering::Acquire) != s.e.rx_tail.load(Ordering::Relaxed) {
                    continue;
                }
            }
        }
        let pe = s.take_error();
        if pe != 0 {
            return Err(pe as i32);
        }
        if s.flags() & f::NO_ENTRY != 0 {
            return Err(libc::EMFILE); // at the socket quota, clients queued
        }
        if s.handed_over() {
            return Err(HANDED_OVER);
        }
        if s.flags() & f::LISTENING == 0 {
            // Shut down for reading: Linux's listener no longer listens (EINVAL, as
            // for a socket that never did) until listen() is called again.
            return Err(libc::EINVAL);
        }
        // Native clients (NATIVE_ACCEPT): taken from the kernel's queue here.
        let native = crate::sock::native::applies(s.flags());
        let mut stale = false;
        if native {
            if let Some(x) = crate::sock::native::accept(&s, flags)? {
                return Ok(x);
            }
            if s.flags() & f::NATIVE_QUEUED != 0 {
                // canald saw clients the kernel no longer holds: it looks again, if
                // it looks at all (`native::canald_looks`).
                stale = true;
                if crate::sock::native::canald_looks(&s) {
                    attention(s.g, s.idx);
                }
            }
        }
        if !native && s.flags() & f::HOST_QUEUED != 0 {
            // The kernel holds clients canald has not taken (none before the first
            // accept): this accept asks for one and waits for canald's answer (a
            // record, or the flag cleared when they are gone), non-blocking or not.
            attention(s.g, s.idx);
            wait_for_first(&s, nonblock)?;
            continue;
        }
        if nonblock {
            return Err(libc::EAGAIN);
        }
        if deadline.is_none() {
            deadline = Some(s.deadline(true));
        }
        wait_for_client(&s, deadline.flatten(), native.then_some(stale))?;
        if s.kind() != sock_kind::LISTENER {
            return Err(libc::EINVAL);
        }
    }
}

/// Takes the ACCEPT record `info` from listener `s`'s ring: the new socket's descriptor
/// and its peer, or ECONNABORTED if it is already gone. Without a descriptor for it the
/// record stays (the connection stays queued, as the kernel leaves it).
fn take_record(
    s: &Sock,
    c: &mut Consumer<'_, RawRing>,
    info: &RecordInfo,
    flags: c_int,
) -> Result<(c_int, Option<CanalAddr>), i32> {
    let (fd, wend) = crate::sock::watch::dummy(s.g, flags & libc::SOCK_CLOEXEC != 0)?;
    let mut p = [0u8; 8];
    c.record_payload(info, 0, &mut p);
    // The peer, then (minor 13) the socket's final names (§4 Names).
    let mut a = [0u8; canal_abi::names::ACCEPT_ADDR_NAMED];
    let peer = if info.addr_len as usize >= ADDR_SIZE {
        c.record_addr(info, &mut a);
        CanalAddr::decode(&a[..ADDR_SIZE])
    } else {
        None
    };
    let named = info.addr_len as usize >= a.len();
    c.consume_record(info);
    let h = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
    match Sock::new(s.g, h) {
        Ok(ns) if ns.kind() == sock_kind::STREAM => {
            crate::sock::core::init_guest_line(ns.e, flags & libc::SOCK_NONBLOCK != 0, Some(s.e));
            let _ = TABLE.set_canal(fd, h);
            crate::sock::watch::created(s.g, h, fd, wend);
            if named {
                crate::sock::names::remember(h, &a[ADDR_SIZE..]);
            } else {
                crate::sock::names::forget(h);
            }
            Ok((fd, peer))
        }
        _ => {
            let _ = sys::close(fd);
            let _ = (wend >= 0).then(|| sys::close(wend));
            Err(libc::ECONNABORTED)
        }
    }
}

/// A canal client was taken by a thread that the kernel had chosen for a native
/// client (its sleep ended on the twin): the native client would wait for this
/// thread's next accept, where natively another blocked thread takes it.
fn native_client_left(s: &Sock) {
    if crate::conn::accept_sleep::woken_by_twin()
        && crate::sock::native::cached(s.handle).is_some_and(crate::sock::native::has_clients)
    {
        crate::conn::accept_sleep::pass_on(s.g, s.idx);
    }
}

/// Waits for canald's answer to an accept that asked for the clients the kernel
/// holds (HOST_QUEUED): a record, the flag gone, or news (an error, a hand-over, a
/// stop, the listener gone). Not an exclusive accept wait: the answer may be no
/// record at all, and every thread that asked must see it. A signal ends a blocking
/// accept with EINTR, as natively; a non-blocking one never sleeps natively, so it
/// asks again rather than fail so.
fn wait_for_first(s: &Sock, nonblock: bool) -> Result<(), i32> {
    let w = crate::conn::wait::wait_until(s.g, s.idx, None, || {
        let st = s.snapshot();
        st.rx_used > 0 || st.flags & f::HOST_QUEUED == 0 || news(&st)
    });
    match w {
        Wait::Ready | Wait::Dead => Ok(()),
        Wait::Interrupted if nonblock => Ok(()),
        _ => Err(wait_err(w, false)),
    }
}

/// Waits until listener `s` may have a client (or news: an error, a hand-over, a
/// stop). `native`: a NATIVE_ACCEPT listener, with whether its NATIVE_QUEUED was just
/// found stale (it counts again once canald has cleared it); its twin is looked at
/// while spinning and polled while asleep, so the kernel wakes the wait.
fn wait_for_client(s: &Sock, deadline: Option<i64>, native: Option<bool>) -> Result<(), i32> {
    let twin = native
        .and_then(|_| crate::sock::native::own_twin(s))
        .unwrap_or(-1);
    let mut stale = native.unwrap_or(false);
    let mut looks = 0u32;
    let exclusive = Twin {
        handle: s.handle,
        fd_of: crate::sock::native::cached,
    };
    let spin = twin < 0 || !crate::sock::native::clients_come_natively(s.handle);
    let w = wait_accept(
        s.g,
        s.idx,
        deadline,
        (twin >= 0).then_some((twin, exclusive)),
        spin,
        || {
            // Spinning: the twin itself every few rounds (a system call).
            looks = looks.wrapping_add(1);
            if twin >= 0
                && looks.is_multiple_of(TWIN_EVERY)
                && crate::sock::native::has_clients(twin)
            {
                return true;
            }
            let st = s.snapshot();
            let queued = st.flags & f::NATIVE_QUEUED != 0;
            stale &= queued;
            st.rx_used > 0 || (queued && !stale) || st.flags & f::HOST_QUEUED != 0 || news(&st)
        },
    );
    match w {
        Wait::Ready | Wait::Dead => Ok(()), // the death: looked at by the caller
        _ => Err(wait_err(w, false)),
    }
}

/// News that ends every wait on a listener, for `accept` to act on: an error, a
/// hand-over, out of entries (EMFILE), stopped listening, or no longer a listener.
fn news(st: &SockState) -> bool {
    st.pending_error != 0
        || st.kind != sock_kind::LISTENER
        || st.flags & (f::NO_ENTRY | f::HANDED_OVER) != 0
        || st.flags & f::LISTENING == 0
}
