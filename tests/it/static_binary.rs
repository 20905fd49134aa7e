//! The `spearlet` that the init container copies into every pod must run in any image: no ELF
//! interpreter, no shared-library dependency. `hack/build-static.sh` builds it and `hack/test.sh`
//! exports its path as `SPEAR_STATIC_SPEARLET`; without that variable these checks are skipped
//! locally and fail under CI. The Dockerfile's `spearlet` stage, which packages it with nothing
//! else to run, is checked as text.

use std::path::{Path, PathBuf};
use std::process::Command;

const ENV: &str = "SPEAR_STATIC_SPEARLET";

/// ELF program header type of the interpreter path (`/lib64/ld-linux-x86-64.so.2`).
const PT_INTERP: u32 = 3;
/// ELF program header type of the dynamic section.
const PT_DYNAMIC: u32 = 2;
/// Dynamic section tag naming a required shared library.
const DT_NEEDED: u64 = 1;

/// The static binary's path, or `None` (after saying why) when this run is not meant to check it.
fn static_spearlet() -> Option<PathBuf> {
    match std::env::var_os(ENV) {
        Some(path) => Some(PathBuf::from(path)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{ENV} is not set under CI: hack/test.sh must build the static spearlet (hack/build-static.sh)")
        }
        None => {
            eprintln!("skipped: run hack/build-static.sh and set {ENV} to its output");
            None
        }
    }
}

/// What the program headers say about dynamic linking.
#[derive(Debug, Default, PartialEq, Eq)]
struct Linking {
    /// The PT_INTERP path, if any.
    interpreter: Option<String>,
    /// Offsets (into the string table) of the DT_NEEDED entries; their count is what matters.
    needed: usize,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads the program headers of a little-endian ELF64 file (x86_64, the only target built).
fn linking(elf: &[u8]) -> Linking {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not ELF64");
    assert_eq!(elf[5], 1, "not little-endian");
    let (phoff, phentsize, phnum) = (u64_at(elf, 0x20) as usize, u16_at(elf, 0x36) as usize, u16_at(elf, 0x38));
    let mut out = Linking::default();
    for i in 0..usize::from(phnum) {
        let ph = phoff + i * phentsize;
        let (kind, offset, size) = (u32_at(elf, ph), u64_at(elf, ph + 8) as usize, u64_at(elf, ph + 32) as usize);
        match kind {
            PT_INTERP => {
                let path = &elf[offset..offset + size];
                out.interpreter = Some(String::from_utf8_lossy(path).trim_end_matches('\0').to_string());
            }
            // A static-pie keeps a dynamic section for its own relocations; only DT_NEEDED
            // entries would mean shared libraries.
            PT_DYNAMIC => {
                for entry in elf[offset..offset + size].chunks_exact(16) {
                    match u64_at(entry, 0) {
                        0 => break,
                        DT_NEEDED => out.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn run(program: &str, args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program} must run: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

#[test]
fn the_elf_check_sees_the_dependencies_of_the_regular_build() {
    // Proves the parser, on a binary known to be dynamic (the test build links glibc dynamically).
    let elf = std::fs::read(env!("CARGO_BIN_EXE_spearlet")).expect("read the test build");
    let linking = linking(&elf);
    assert!(linking.interpreter.as_deref().is_some_and(|i| i.contains("ld-linux")), "{linking:?}");
    assert!(linking.needed > 0, "{linking:?}");
}

#[test]
fn static_spearlet_has_no_dynamic_dependencies() {
    let Some(path) = static_spearlet() else { return };
    let elf = std::fs::read(&path).unwrap_or_else(|e| panic!("{ENV}={}: {e}", path.display()));
    assert_eq!(linking(&elf), Linking::default(), "{} must need no interpreter and no shared library", path.display());

    let (_, ldd) = run("ldd", &[path.as_os_str()]);
    assert!(
        ldd.contains("not a dynamic executable") || ldd.contains("statically linked"),
        "ldd sees dependencies:\n{ldd}"
    );
    let (code, readelf) = run("readelf", &["-d".as_ref(), "-l".as_ref(), path.as_os_str()]);
    assert_eq!(code, Some(0), "{readelf}");
    assert!(!readelf.contains("(NEEDED)"), "readelf -d lists a NEEDED library:\n{readelf}");
    assert!(!readelf.contains("INTERP"), "readelf -l lists an interpreter:\n{readelf}");

    let (code, version) = run(path.to_str().expect("utf-8 path"), &["--version".as_ref()]);
    assert_eq!(code, Some(0), "{version}");
    assert!(version.starts_with("spearlet "), "{version}");
}

#[test]
fn static_spearlet_bridges_a_child() {
    let Some(path) = static_spearlet() else { return };
    let bridge = crate::bridge::Bridge::start_with(Path::new(&path), &[], &["cat".to_string()]);
    crate::bridge::assert_relays_byte_exact(&bridge, 1024 * 1024);
}

/// The shipped binary does the init container's job (`/spearlet install --to ...`), and its copy
/// runs.
#[test]
fn static_spearlet_installs_itself() {
    let Some(path) = static_spearlet() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("spearlet");
    let (code, out) = run(path.to_str().expect("utf-8 path"), &["install".as_ref(), "--to".as_ref(), dest.as_os_str()]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(std::fs::read(&dest).expect("installed"), std::fs::read(&path).expect("the original"));
    let (code, version) = run(dest.to_str().expect("utf-8 path"), &["--version".as_ref()]);
    assert_eq!(code, Some(0), "{version}");
}

/// The spearlet image holds the static binary and nothing to run besides it: no shell, no
/// busybox, no `cp` (the init container runs `/spearlet install`). Its stage is checked as text:
/// `FROM scratch` plus the `base` context (a distroless-`static` equivalent that
/// `hack/images.sh rootfs base` builds from ca-certificates, tzdata and base-files, none of which
/// ships an executable) plus the binary; the e2e run starts the image built from it.
#[test]
fn the_spearlet_image_is_distroless_static_without_a_shell() {
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).expect("Dockerfile");
    let stage: Vec<&str> = dockerfile
        .lines()
        .skip_while(|l| !(l.starts_with("FROM ") && l.ends_with(" AS spearlet")))
        .take_while(|l| !l.starts_with("# ---"))
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    let from = stage.first().expect("a `spearlet` stage");
    assert_eq!(*from, "FROM scratch AS spearlet", "no base image: nothing can be pulled where CI builds it");
    let copies: Vec<&&str> = stage.iter().filter(|l| l.starts_with("COPY ")).collect();
    assert_eq!(copies.len(), 2, "the base and the binary, nothing else: {stage:?}");
    assert_eq!(*copies[0], "COPY --from=base / /", "{stage:?}");
    let image_spearlet = spear::api::keys::IMAGE_SPEARLET;
    assert!(stage.iter().any(|l| l.starts_with("COPY ") && l.ends_with(&format!(" {image_spearlet}"))), "{stage:?}");
    assert!(stage.contains(&format!("ENTRYPOINT [\"{image_spearlet}\"]").as_str()), "{stage:?}");
    assert!(!stage.iter().any(|l| l.starts_with("RUN ")), "a RUN step needs a shell in the image: {stage:?}");
}
