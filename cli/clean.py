"""``nslab clean [NAME]``: remove a crashed lab's leftovers by prefix."""
from __future__ import annotations

from lab.capabilities import require_root
from lab.clean import clean, labs_present, stale_probes
from lab.netlink import remove_netns


def add_parser(sub) -> None:
    p = sub.add_parser("clean", help="remove leftovers of crashed labs",
                       description="Remove the namespaces, cgroups, processes (by PID, found "
                                   "in the lab's namespaces and cgroups) and state of lab NAME, "
                                   "or of every nslab lab when NAME is omitted (then also the "
                                   "namespaces of capability probes whose process is gone; "
                                   "NAME 'probe': those alone). "
                                   "Nothing outside the 'nslab-' prefix is touched.")
    p.add_argument("name", nargs="?", help="lab name (default: all labs); 'probe': the "
                   "namespaces killed capability probes left")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p.set_defaults(func=main)


def main(args) -> int:
    require_root()
    labs = [args.name] if args.name and args.name != "probe" else [] if args.name \
        else labs_present()
    probes = stale_probes() if args.name in (None, "probe") else []
    if not labs and not probes:
        print("no nslab leftovers")
    for ns in probes:
        print(f"{'would remove' if args.dry_run else 'removed'} netns {ns} (a killed probe's)")
        if not args.dry_run:
            remove_netns(ns)
    for lab in labs:
        done = clean(lab, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        print(f"lab {lab}: {verb} {len(done)} object(s)")
        for item in done:
            print(f"  {item}")
    return 0
