//! Fuzzes canald's request consumer: the input is laid over a guest region's slots,
//! queue, socket entries, attention bits and ring bytes, then canald runs service
//! rounds (`canald::fuzz::fuzz_request_consumer`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    canald::fuzz::fuzz_request_consumer(data);
});
