//! Readiness over many descriptors: poll/select (`poll`) and epoll (`epoll`) over any mix
//! of canal and ordinary descriptors; `pollwait` is their shared kernel wait; `kick` wakes
//! an epoll set's sleepers when another thread adds to the set.

pub(crate) mod edge;
pub(crate) mod epoll;
pub(crate) mod evset;
pub(crate) mod kick;
pub(crate) mod poll;
pub(crate) mod pollwait;
