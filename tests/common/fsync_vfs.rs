//! A SQLite VFS for tests that counts, and on demand fails, the fsyncs of
//! one database's write-ahead log. It wraps the platform's default VFS and
//! forwards every other call unchanged. A connection uses it through a URI
//! filename (rusqlite opens URIs by default), so connections opened by plain
//! path are not affected: `file:/tmp/x.db?vfs=sr-fsync-probe`.
//!
//! It lets a test see what `PRAGMA synchronous` cannot show from outside the
//! store's own connection: whether each commit reached the disk before the
//! receipt was handed out, and what the receiver answers when it did not.

use rusqlite::ffi;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The name connections ask for in their URI (`?vfs=...`).
const NAME: &CStr = c"sr-fsync-probe";

/// What the VFS saw, and does, for one watched database.
#[derive(Debug, Default)]
pub struct Probe {
    /// fsyncs of the write-ahead log (`<db>-wal`) that succeeded.
    wal_syncs: AtomicU64,
    /// While set, every fsync of the write-ahead log fails with
    /// `SQLITE_IOERR_FSYNC` without reaching the disk.
    fail_wal_syncs: AtomicBool,
}

impl Probe {
    /// fsyncs of the write-ahead log so far.
    pub fn wal_syncs(&self) -> u64 {
        self.wal_syncs.load(Ordering::SeqCst)
    }

    /// Makes every later fsync of the write-ahead log fail (`true`) or work.
    pub fn fail_wal_syncs(&self, fail: bool) {
        self.fail_wal_syncs.store(fail, Ordering::SeqCst);
    }
}

/// Watched databases by full path (as SQLite names the main file).
fn watched() -> &'static Mutex<HashMap<String, Arc<Probe>>> {
    static WATCHED: OnceLock<Mutex<HashMap<String, Arc<Probe>>>> = OnceLock::new();
    WATCHED.get_or_init(Mutex::default)
}

/// Registers the VFS (once per process) and watches the database at `path`
/// (its folder must exist). Returns the probe and the URI filename to open.
pub fn watch(path: &Path) -> (Arc<Probe>, String) {
    register();
    let dir = path.parent().unwrap().canonicalize().unwrap();
    let full = dir.join(path.file_name().unwrap());
    let full = full.to_str().expect("a UTF-8 path").to_owned();
    let probe = Arc::new(Probe::default());
    watched()
        .lock()
        .unwrap()
        .insert(full.clone(), probe.clone());
    (probe, format!("file:{full}?vfs={}", NAME.to_str().unwrap()))
}

/// One open file: SQLite's header, the default VFS's file right behind it
/// (`szOsFile` leaves room for both), and what this VFS does with it.
#[repr(C)]
struct File {
    /// Must come first: SQLite sees a `sqlite3_file` whose methods are ours.
    base: ffi::sqlite3_file,
    /// The default VFS's file, in the same allocation just after this struct.
    real: *mut ffi::sqlite3_file,
    /// The probe of a watched database's write-ahead log (from
    /// `Arc::into_raw`, released on close), or null.
    wal_probe: *const Probe,
}

fn register() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find(NULL) initializes SQLite and returns the
        // default VFS, which lives as long as the process. The VFS struct is
        // leaked, so the pointer registered stays valid for good.
        unsafe {
            let real = ffi::sqlite3_vfs_find(ptr::null());
            assert!(!real.is_null(), "SQLite has no default VFS");
            let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
                iVersion: 2,
                szOsFile: (std::mem::size_of::<File>() as c_int) + (*real).szOsFile,
                mxPathname: (*real).mxPathname,
                pNext: ptr::null_mut(),
                zName: NAME.as_ptr(),
                pAppData: real.cast(),
                xOpen: Some(x_open),
                xDelete: Some(x_delete),
                xAccess: Some(x_access),
                xFullPathname: Some(x_full_pathname),
                xDlOpen: None,
                xDlError: None,
                xDlSym: None,
                xDlClose: None,
                xRandomness: Some(x_randomness),
                xSleep: Some(x_sleep),
                xCurrentTime: Some(x_current_time),
                xGetLastError: Some(x_get_last_error),
                xCurrentTimeInt64: Some(x_current_time_int64),
                xSetSystemCall: None,
                xGetSystemCall: None,
                xNextSystemCall: None,
            }));
            let rc = ffi::sqlite3_vfs_register(vfs, 0);
            assert_eq!(rc, ffi::SQLITE_OK, "registering the test VFS");
        }
    });
}

/// The default VFS this one wraps.
///
/// # Safety
/// `vfs` is this VFS (its `pAppData` is the default VFS).
unsafe fn inner(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    unsafe { (*vfs).pAppData.cast() }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite hands over `szOsFile` bytes for `file`: room for a
    // `File` followed by the default VFS's file.
    unsafe {
        let f = file.cast::<File>();
        let real = file
            .cast::<u8>()
            .add(std::mem::size_of::<File>())
            .cast::<ffi::sqlite3_file>();
        (*f).base.pMethods = ptr::null();
        (*f).real = real;
        (*f).wal_probe = ptr::null();
        let vfs = inner(vfs);
        let rc = (*vfs).xOpen.expect("xOpen")(vfs, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*real).pMethods.is_null() {
            return rc;
        }
        if flags & ffi::SQLITE_OPEN_WAL != 0 && !name.is_null() {
            let name = CStr::from_ptr(name).to_string_lossy();
            if let Some(db) = name.strip_suffix("-wal") {
                if let Some(probe) = watched().lock().unwrap().get(db) {
                    (*f).wal_probe = Arc::into_raw(probe.clone());
                }
            }
        }
        (*f).base.pMethods = &METHODS;
        rc
    }
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xDelete.expect("xDelete")(vfs, name, sync_dir)
    }
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xAccess.expect("xAccess")(vfs, name, flags, out)
    }
}

unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xFullPathname.expect("xFullPathname")(vfs, name, n, out)
    }
}

unsafe extern "C" fn x_randomness(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xRandomness.expect("xRandomness")(vfs, n, out)
    }
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xSleep.expect("xSleep")(vfs, micros)
    }
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xCurrentTime.expect("xCurrentTime")(vfs, out)
    }
}

unsafe extern "C" fn x_get_last_error(
    vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xGetLastError.expect("xGetLastError")(vfs, n, out)
    }
}

unsafe extern "C" fn x_current_time_int64(
    vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let vfs = inner(vfs);
        (*vfs).xCurrentTimeInt64.expect("xCurrentTimeInt64")(vfs, out)
    }
}

/// The methods of a file this VFS opened: `xSync` is ours, the rest forward.
static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

/// The default VFS's file behind `file`, and its methods.
///
/// # Safety
/// `file` was opened by [`x_open`] successfully.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    unsafe {
        let real = (*file.cast::<File>()).real;
        (real, &*(*real).pMethods)
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let f = file.cast::<File>();
        if !(*f).wal_probe.is_null() {
            drop(Arc::from_raw((*f).wal_probe));
            (*f).wal_probe = ptr::null();
        }
        let (real, m) = real(file);
        m.xClose.expect("xClose")(real)
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    unsafe {
        let probe = (*file.cast::<File>()).wal_probe;
        if !probe.is_null() && (*probe).fail_wal_syncs.load(Ordering::SeqCst) {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        let (real, m) = real(file);
        let rc = m.xSync.expect("xSync")(real, flags);
        if rc == ffi::SQLITE_OK && !probe.is_null() {
            (*probe).wal_syncs.fetch_add(1, Ordering::SeqCst);
        }
        rc
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xRead.expect("xRead")(real, buf, n, offset)
    }
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xWrite.expect("xWrite")(real, buf, n, offset)
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xTruncate.expect("xTruncate")(real, size)
    }
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xFileSize.expect("xFileSize")(real, out)
    }
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xLock.expect("xLock")(real, level)
    }
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xUnlock.expect("xUnlock")(real, level)
    }
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xCheckReservedLock.expect("xCheckReservedLock")(real, out)
    }
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xFileControl.expect("xFileControl")(real, op, arg)
    }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xSectorSize.expect("xSectorSize")(real)
    }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xDeviceCharacteristics.expect("xDeviceCharacteristics")(real)
    }
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xShmMap.expect("xShmMap")(real, page, size, extend, out)
    }
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xShmLock.expect("xShmLock")(real, offset, n, flags)
    }
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    unsafe {
        let (real, m) = real(file);
        m.xShmBarrier.expect("xShmBarrier")(real)
    }
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xShmUnmap.expect("xShmUnmap")(real, delete)
    }
}

unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xFetch.expect("xFetch")(real, offset, n, out)
    }
}

unsafe extern "C" fn x_unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    p: *mut c_void,
) -> c_int {
    unsafe {
        let (real, m) = real(file);
        m.xUnfetch.expect("xUnfetch")(real, offset, p)
    }
}
