"""Safe outputs: what opsnn-quant wrote, and how it writes, replaces and locks it.

Every output directory opsnn-quant writes carries a marker file naming the kind of output
(``calibrate``, ``probe``, ``quant``, ``report``...) and listing what it holds
(:mod:`.ownership`). A directory is replaced only when it is empty or, entry by entry, an output
of the same kind, unless the caller forces it; a loose output file only when it holds what we
wrote there. Anything else is refused with one line naming the path. ``--force`` replaces only
what we wrote: an output of another kind or one edited since (its marker still there), never a
directory without our marker, a file, a home directory, a filesystem root or mount point, a
directory holding a ``.git``, or an input of the command (:mod:`.places`). Every writer into an
output holds its lock and the locks of the outputs it lies in (:mod:`.locks`). Directories are
built in a ``<name>.tmp-<token>`` sibling and swapped in by two renames (:mod:`.directories`);
a run killed between the two is repaired by the next one. Loose files are recorded in a ledger
beside them (:mod:`.loose`); single files are written atomically (:mod:`.files`).

Only the command layer owns an output directory; the formats write into the file or the new or
empty directory they are given (:func:`.files.empty_dir`).
"""
