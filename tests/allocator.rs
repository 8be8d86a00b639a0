//! The agent's allocator policy (`drivelet::agent::tune_allocator`, set by `drivelet
//! run` before anything else): freed buffers go back to the kernel at once, also after
//! a large one was freed, which glibc left alone would answer by keeping every later
//! buffer below that size resident. Its own test binary with one test, so no other
//! test allocates meanwhile and the counts are exact.

#[cfg(target_env = "gnu")]
#[test]
fn freed_buffers_go_back_to_the_kernel_even_after_a_large_one() {
    drivelet::agent::tune_allocator();
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = || unsafe { libc::mallinfo2() };
    let mapped = info().hblks;

    // A clone's copy buffer (4 MiB): pages of its own, unmapped when freed.
    let copy = vec![1u8; 4 << 20];
    assert_eq!(info().hblks, mapped + 1, "a 4 MiB buffer is mapped on its own");
    drop(copy);
    assert_eq!(info().hblks, mapped, "a freed 4 MiB buffer is unmapped at once");

    // Left alone, glibc would now serve anything below 4 MiB from an arena and keep its
    // pages after free; a wipe's 1 MiB buffer still gets pages of its own.
    let wipe = vec![1u8; 1 << 20];
    assert_eq!(info().hblks, mapped + 1, "after a large free, a 1 MiB buffer is still mapped on its own");
    drop(wipe);
    assert_eq!(info().hblks, mapped);

    // Small allocations come from an arena; once freed, its top goes back to the kernel.
    let before = info().arena;
    let pages: Vec<Vec<u8>> = (0..512).map(|_| vec![1u8; 4096]).collect();
    let grown = info().arena;
    assert!(grown >= before + (1 << 20), "512 small buffers grew the arena from {before} to {grown} bytes");
    drop(pages);
    let after = info().arena;
    assert!(
        after <= before + drivelet::agent::ALLOCATOR_THRESHOLD as usize,
        "the arena kept {after} bytes after the buffers were freed (before: {before})"
    );
}
