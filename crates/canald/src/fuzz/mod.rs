//! Fuzz entry points, one per input canald reads from a guest or a client (the logic
//! lives here so unit tests run it on seeds; `fuzz/fuzz_targets/*.rs` only call it):
//! the request consumer (`requests`), the control socket (`control`), a VM's region
//! (`vm`), and the ivshmem server's client (`ivshmem`). docs/operations.md, "Fuzzing".
mod control;
mod ivshmem;
mod requests;
mod vm;

pub use control::fuzz_control;
pub use ivshmem::fuzz_ivshmem_client;
pub use requests::{fuzz_request_consumer, Outcome};
pub use vm::fuzz_vm_region;
