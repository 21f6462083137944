//! The connection to canald: attaching, the control socket, request slots, requests
//! and waits. Layered bottom-up: `guest` (state) < `ctl` < `slots` < `request`,
//! `pin` < `sleep` < `wait`; `attach` and `inherit` make a `Guest`; `ivshmem` is the VM transport.

pub(crate) mod accept_sleep;
pub(crate) mod attach;
pub(crate) mod ctl;
pub(crate) mod guest;
pub(crate) mod inherit;
pub(crate) mod ivshmem;
pub(crate) mod pin;
pub(crate) mod request;
pub(crate) mod sleep;
pub(crate) mod slots;
pub(crate) mod wait;
