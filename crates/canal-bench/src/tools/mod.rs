//! The external tools a cell may run, one file each: sockperf, iperf3, redis-benchmark,
//! nginx with wrk, memcached with memaslap, PostgreSQL with pgbench, and strace (system calls per message). Each adds its `run_*` to
//! `Runner` and parses the tool's output.

pub(crate) mod iperf3;
pub(crate) mod memcached;
pub(crate) mod nginx;
pub(crate) mod pg_setup;
pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod sockperf;
pub(crate) mod strace;

#[cfg(test)]
mod tests {
    use super::memcached::parse_memaslap;
    use super::nginx::parse_wrk;
    use super::redis::parse_redis_csv;
    use super::sockperf::parse_sockperf;
    use super::strace::parse_strace_c;

    #[test]
    fn parses_tool_outputs() {
        let s = "sockperf: \u{1b}[2;35m====> avg-latency=10.751 (std-dev=10.399)\u{1b}[0m\n\
                 sockperf: ---> percentile 99.000 =   16.155\nsockperf: ---> percentile 50.000 =   10.228\n";
        let m = parse_sockperf(s).unwrap();
        assert_eq!(m[0], ("rtt_p50_us".to_string(), 20.456));
        assert!((m[2].1 - 21.502).abs() < 1e-9);
        let r = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                 \"SET\",\"60240.96\",\"0.101\",\"0.032\",\"0.079\",\"0.199\",\"0.223\",\"0.495\"\n\
                 \"GET\",\"79365.08\",\"0.072\",\"0.016\",\"0.071\",\"0.087\",\"0.119\",\"0.319\"\n";
        let m = parse_redis_csv(r).unwrap();
        assert_eq!(m[0], ("set_rps".to_string(), 60240.96));
        assert!((m[5].1 - 119.0).abs() < 1e-6);
        let w = "  Latency Distribution\n     50%   47.00us\n     99%    1.27ms\nRequests/sec: 113639.19\n";
        let m = parse_wrk(w).unwrap();
        assert_eq!(
            m,
            vec![
                ("p50_us".into(), 47.0),
                ("p99_us".into(), 1270.0),
                ("req_s".into(), 113639.19)
            ]
        );
        assert!(parse_wrk("Socket errors: connect 10\nRequests/sec: 1\n").is_err());
        assert!(parse_wrk("  Non-2xx or 3xx responses: 7\nRequests/sec: 1\n").is_err());
        let mc = "cmd_get: 318676\nverify_failed: 0\nexpired_get: 0\n\n\
                  Run time: 3.0s Ops: 354092 TPS: 118017 Net_rate: 132.0M/s\n";
        assert_eq!(
            parse_memaslap(mc).unwrap(),
            vec![("ops_rps".to_string(), 118017.0)]
        );
        assert!(parse_memaslap(&mc.replace("verify_failed: 0", "verify_failed: 3")).is_err());
        assert!(parse_memaslap("servers: 127.0.0.1:1\n").is_err());
        let st = "% time     seconds  usecs/call     calls    errors syscall\n------ ----------- ----------- --------- --------- ----------------\n \
                  60.00    0.000300          10        30           sendto\n 40.00    0.000200          10        20         2 recvfrom\n\
                  ------ ----------- ----------- --------- --------- ----------------\n100.00    0.000500          10        50         2 total\n";
        assert_eq!(
            parse_strace_c(st).unwrap(),
            vec![("sendto".into(), 30.0), ("recvfrom".into(), 20.0)]
        );
    }
}
