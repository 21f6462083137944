//! `CANAL_REJOIN`: the variable an exec'd image inherits (its format, its parser) and
//! re-attaching to the same guest through the inherited descriptors.
use crate::conn::attach::daemon_trusted;
use crate::conn::attach::map_region;
use crate::conn::attach::vrss_setup;
use crate::conn::attach::wait_settings;
use crate::conn::guest::Guest;
use crate::conn::guest::ATTACH_LOCK;
use crate::conn::guest::GUEST;
use crate::conn::slots::release_slot;
use crate::rt::debug;
use crate::rt::env;
use crate::rt::lock;
use crate::rt::unlock;
use crate::rt::PID;
use crate::sys;
use canal_abi::feature;
use canal_abi::sync::AtomicU32;
use canal_abi::sync::Ordering;
use core::sync::atomic::AtomicI32;
use libc::c_int;

pub(crate) const VAR: &str = "CANAL_REJOIN";

/// Encodes the rejoin value: `ctl,memfd,doorbell,lockfd,region_size,old_slot;` then
/// the canal descriptors `fd:handle,...`, and after a second `;` the bridged ones
/// (bridge.rs) in the same form, and after a third the bridges' receive tokens.
pub(crate) fn encode(
    g: (c_int, c_int, c_int, c_int, u64),
    old_slot: u32,
    fds: &[(c_int, u32)],
    bridged: &[(c_int, u32)],
    tokens: &[(c_int, u32)],
) -> String {
    let list = |v: &[(c_int, u32)]| {
        v.iter()
            .map(|(fd, h)| format!("{fd}:{h}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut s = format!(
        "{},{},{},{},{},{};{}",
        g.0,
        g.1,
        g.2,
        g.3,
        g.4,
        old_slot,
        list(fds)
    );
    if !bridged.is_empty() || !tokens.is_empty() {
        s.push(';');
        s.push_str(&list(bridged));
    }
    if !tokens.is_empty() {
        s.push(';');
        s.push_str(&list(tokens));
    }
    s
}

/// What `encode` wrote.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) ctl: c_int,
    pub(crate) memfd: c_int,
    pub(crate) doorbell: c_int,
    pub(crate) lockfd: c_int,
    pub(crate) region_size: u64,
    pub(crate) old_slot: u32,
    pub(crate) fds: Vec<(c_int, u32)>,
    pub(crate) bridged: Vec<(c_int, u32)>,
    pub(crate) tokens: Vec<(c_int, u32)>,
}

pub(crate) fn parse(v: &str) -> Option<Parsed> {
    let (head, tail) = v.split_once(';')?;
    let h: Vec<&str> = head.split(',').collect();
    if h.len() != 6 {
        return None;
    }
    let fd = |s: &str| s.parse::<c_int>().ok().filter(|&f| f >= 0);
    let list = |t: &str| -> Option<Vec<(c_int, u32)>> {
        let mut v = Vec::new();
        for p in t.split(',').filter(|p| !p.is_empty()) {
            let (f, hd) = p.split_once(':')?;
            v.push((fd(f)?, hd.parse::<u32>().ok()?));
        }
        Some(v)
    };
    let mut parts = tail.splitn(3, ';');
    let mut next = || parts.next().unwrap_or("");
    let (fds, bridged, tokens) = (list(next())?, list(next())?, list(next())?);
    Some(Parsed {
        ctl: fd(h[0])?,
        memfd: fd(h[1])?,
        doorbell: fd(h[2])?,
        lockfd: fd(h[3])?,
        region_size: h[4].parse().ok()?,
        old_slot: h[5].parse().ok()?,
        fds,
        bridged,
        tokens,
    })
}

/// The inherited descriptors are what rejoin.rs says: four distinct ones, a control
/// socket served by a daemon we trust, the region memfd of the announced size, an
/// eventfd, and the one-page lock memfd.
fn check_rejoin_fds(p: &crate::conn::inherit::Parsed) -> Result<(), &'static str> {
    let fds = [p.ctl, p.memfd, p.doorbell, p.lockfd];
    if (0..4).any(|i| (i + 1..4).any(|j| fds[i] == fds[j])) {
        return Err("descriptors repeat");
    }
    let kind = |fd| sys::fd_kind(fd).map_err(|_| "a descriptor is missing");
    if kind(p.ctl)?.0 != libc::S_IFSOCK {
        return Err("the control descriptor is not a socket");
    }
    // SAFETY: getuid has no preconditions.
    if daemon_trusted(p.ctl, unsafe { libc::getuid() }) != Ok(true) {
        return Err("the control socket's daemon is not ours");
    }
    if kind(p.memfd)? != (libc::S_IFREG, p.region_size) || kind(p.lockfd)? != (libc::S_IFREG, 4096)
    {
        return Err("the region or lock page does not match");
    }
    if !sys::is_eventfd(p.doorbell) {
        return Err("the doorbell is not an eventfd");
    }
    Ok(())
}

/// The exec'd image's side of rejoin.rs: the same guest, from inherited descriptors.
pub(crate) fn rejoin(p: &crate::conn::inherit::Parsed) -> Option<&'static Guest> {
    let fail = |what: &str| {
        sys::log_fmt(format_args!(
            "canal: cannot rejoin the guest after exec ({what}); inherited sockets are not usable\n"
        ));
        None
    };
    // Validate everything before changing anything (a garbage CANAL_REJOIN must not
    // mark the program's own descriptors, e.g. 0-2, close-on-exec).
    if let Err(what) = check_rejoin_fds(p) {
        return fail(what);
    }
    for fd in [p.ctl, p.memfd, p.doorbell, p.lockfd] {
        if sys::fcntl_int(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long).is_err() {
            return fail("a descriptor is missing");
        }
    }
    let Ok(region) = map_region(p.memfd, p.region_size) else {
        return fail("region");
    };
    let Ok(page) = sys::mmap_shared(p.lockfd, 4096) else {
        return fail("lock page");
    };
    // SAFETY: as in attach_on: a 4096-byte shared page, never unmapped.
    let ctl_lock = unsafe { &*(page as *const AtomicU32) };
    // Already high in the parent (ownfd.rs); adopt moves them up if its limit was lower.
    let [ctl, memfd, doorbell, lockfd] =
        [p.ctl, p.memfd, p.doorbell, p.lockfd].map(crate::ownfd::adopt);
    let features = region.header().features;
    let debug = env(c"CANAL_LOG").is_some_and(|v| v == b"debug");
    PID.store(sys::getpid(), Ordering::Relaxed);
    let g = Guest {
        region,
        ctl: AtomicI32::new(ctl),
        doorbell: AtomicI32::new(doorbell),
        ctl_lock,
        ports: features & feature::PORT_EVENTFD != 0,
        wait: wait_settings(),
        debug,
        memfd: AtomicI32::new(memfd),
        region_size: p.region_size,
        lockfd: AtomicI32::new(lockfd),
        wdoor: Default::default(),
        nworkers: AtomicU32::new(0),
    };
    lock(&ATTACH_LOCK);
    let ok = GUEST.set(g).is_ok();
    unlock(&ATTACH_LOCK);
    let g = GUEST.get()?;
    if !ok {
        return Some(g);
    }
    // The doorbells are not inherited over exec: ask canald again.
    vrss_setup(g);
    // The exec'ing thread's slot: idle, and nobody in this image owns it.
    if p.old_slot != u32::MAX {
        release_slot(g, p.old_slot, -1);
    }
    debug!(
        g,
        "canal: rejoined guest {} after exec\n",
        g.region.header().guest_id
    );
    Some(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let s = encode((5, 6, 7, 8, 1 << 30), 3, &[(4, 0x1_0002), (9, 7)], &[], &[]);
        let p = parse(&s).unwrap();
        assert_eq!(
            p,
            Parsed {
                ctl: 5,
                memfd: 6,
                doorbell: 7,
                lockfd: 8,
                region_size: 1 << 30,
                old_slot: 3,
                fds: vec![(4, 0x1_0002), (9, 7)],
                bridged: vec![],
                tokens: vec![],
            }
        );
        let p = parse(&encode(
            (5, 6, 7, 8, 1 << 30),
            3,
            &[],
            &[(0, 9), (1, 9)],
            &[(40, 9)],
        ))
        .unwrap();
        assert_eq!(
            (p.fds, p.bridged, p.tokens),
            (vec![], vec![(0, 9), (1, 9)], vec![(40, 9)])
        );
        assert!(parse("1,2,3,4,5,6;;x:1").is_none());
        assert!(parse("1,2,3;").is_none());
        assert!(parse("1,2,3,4,5,6;x:1").is_none());
        assert!(parse("-1,2,3,4,5,6;").is_none());
        assert_eq!(parse("1,2,3,4,5,6;").unwrap().fds, vec![]);
    }
}
