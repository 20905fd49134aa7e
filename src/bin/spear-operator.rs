fn main() { print!("{}", spear::api::crd::render_all().unwrap()); }
