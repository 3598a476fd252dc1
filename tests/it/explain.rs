// Tests of `snapscan explain` (filled in with the explain command).
