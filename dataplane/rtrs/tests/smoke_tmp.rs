use std::time::Duration;
use dp_rtrs::sim::{Sim, SimConfig};

#[test]
fn smoke() {
    let mut s = Sim::new(SimConfig::new(1));
    s.open();
    println!("opened at {:?}: {:?}", s.now, s.client_log);
    s.app.target = 32;
    s.run_for(Duration::from_millis(50));
    println!("issued {} ok {} failed {} verify {} submit_err {} handler req {} bad {} rnr {} access {} faults {}",
        s.app.issued, s.app.ok, s.app.failed, s.app.verify_errors, s.app.submit_errors,
        s.handler.requests, s.handler.bad_requests, s.net.rnr_waits, s.net.access_errors, s.net.bounds_faults);
    println!("client log {:?}", s.client_log);
    println!("server log {:?}", s.server_log);
    for p in s.paths.clone() { println!("{:?} {:?} {:?}", p, s.client.path_state(p), s.client.path_stats(p)); }
    assert!(s.app.ok > 100);
}
