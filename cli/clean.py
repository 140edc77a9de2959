"""``nslab clean [NAME]``: remove a crashed lab's leftovers by prefix."""
from __future__ import annotations

from lab.capabilities import require_root
from lab.clean import clean, labs_present


def add_parser(sub) -> None:
    p = sub.add_parser("clean", help="remove leftovers of crashed labs",
                       description="Remove the namespaces, cgroups, processes (by PID, found "
                                   "in the lab's namespaces and cgroups) and state of lab NAME, "
                                   "or of every nslab lab when NAME is omitted. Nothing outside "
                                   "the 'nslab-' prefix is touched.")
    p.add_argument("name", nargs="?", help="lab name (default: all labs)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p.set_defaults(func=main)


def main(args) -> int:
    require_root()
    labs = [args.name] if args.name else labs_present()
    if not labs:
        print("no nslab leftovers")
    for lab in labs:
        done = clean(lab, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        print(f"lab {lab}: {verb} {len(done)} object(s)")
        for item in done:
            print(f"  {item}")
    return 0
