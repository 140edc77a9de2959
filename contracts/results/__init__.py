"""The results document (schema ``nslab.results/1``) that ``nslab run SCENARIO --json PATH``
writes: ``Results`` is its one definition, ``results_schema()`` its JSON Schema (``nslab schema
results``).

Sections always present: ``scenario``, ``lab``, ``truth``, ``teardown``. The others (``load``,
``agents``, ``sync``, ``owd_us``, ``collocation``, ``jobs``, ``comparisons`` and each study's,
``contracts.studies``) appear when measured: an absent section means "not measured", never a
placeholder, so ``dump`` and ``write`` leave it out. A None inside a present section is written
as null (a value that could not be measured this time).

Units are in the field names and descriptions: ns, us, s; bit/s, Mbit/s; ppm; bytes, MiB;
fractions (0.03 = 3 %) and percent are said so.
"""
from contracts.results.document import (
    OPTIONAL_SECTIONS,
    SCHEMA,
    Results,
    dump,
    results_schema,
    validate,
    write,
)

__all__ = ["OPTIONAL_SECTIONS", "SCHEMA", "Results", "dump", "results_schema", "validate",
           "write"]
