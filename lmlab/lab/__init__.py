"""The ablation lab: a spec of variants becomes runs, numbers, and verdicts a researcher can cite.

- :mod:`lmlab.lab.spec`: the spec format (axes, baseline, tune, match, expect, scales, timing) as typed
  records, and its parsing and validation;
- :mod:`lmlab.lab.plan`: a spec expanded into runs, with the controls solved (``lmlab sweep --dry-run``);
- :mod:`lmlab.lab.runner`: trains and scores every run as an ordinary run folder, resumable, with the
  timing block, provenance and the machine's load recorded (``lmlab sweep``);
- :mod:`lmlab.lab.timing`: the interleaved speed micro-benchmark of a spec's variants;
- :mod:`lmlab.lab.stats`: paired differences, t- and sign-test intervals, pooled noise, verdicts;
- :mod:`lmlab.lab.verdicts`: a sweep's results turned into chosen tuned values, comparisons and claims;
- :mod:`lmlab.lab.report`: a sweep's page assembled (``lmlab report``): its rows read and analysed, the
  figures drawn by :mod:`lmlab.lab.plots`, the markdown rendered by :mod:`lmlab.lab.page` (the verdict
  table's cells: :mod:`lmlab.lab.verdict_table`);
- :mod:`lmlab.lab.index`: the index of all claims and the blocks it writes into README.md
  (``lmlab report --index``);
- :mod:`lmlab.lab.validate`: every file a report or a resumed sweep reads back, checked field by field
  (one line naming the file, line and field of a damaged one).
"""
