//! Fuzzes canald: `canald::fuzz::fuzz_vm_region` (its module says what the input is and which
//! properties are checked).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    canald::fuzz::fuzz_vm_region(data);
});
