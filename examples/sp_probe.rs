fn main() {
    for p in std::env::args().skip(1) {
        let (b, _) = snapscan::input::read_input(std::path::Path::new(&p)).unwrap();
        let r = serde_pickle::value_from_slice(&b, serde_pickle::DeOptions::new());
        println!("{p}: {}", match r { Ok(_) => "ok".to_string(), Err(e) => e.to_string() });
    }
}
