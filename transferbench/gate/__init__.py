"""The regression gate: its decision between two records folders (a baseline and tonight's), apart from the records
store it reads. Its rules are written here once; docs/regression.md explains them with examples, and
`reporting.regress` renders the decision.

1. **Matching** (`gate.match`, its keys in `gate.keys`). Cells match on what they are: task, dataset, backbone,
   stage, seed and the report axes (the hyper-parameters that vary between a dataset's cells on either side: shots,
   lr in the select stage, ...). A final stage's selected values (its `select` keys) are an outcome, not an identity.
2. **Protocol changes** (`gate.match`). Every other setting of a matched cell (hyper-parameters, the dataset's
   configuration, the protocol version) must agree. A difference is listed by setting (`pool: gap → tok`) and fails
   the gate unless it is accepted by name (`--accept TASK:SETTING`); a changed cell's numbers are shown but not
   tested.
3. **The exact tier comes first** (`gate.match`). A matched cell whose two records carry the same arithmetic digest
   (transferbench.arithmetic: kernels, threads, BLAS, library versions, precision, ...) is judged to the bit, not
   by statistics: equal outputs pass; different outputs where the code fingerprints differ fail, naming the modules
   that changed (`--accept-code MODULE` accepts an intended change); different outputs from the same code, weights
   and data are *irreproducible* and fail. Only the cells whose arithmetic differs (or is unrecorded) reach the
   tests of 4.
4. **Tests** (`gate.comparisons`, `gate.broad`), on every metric a record holds, each with the direction and floor
   `gate.metrics` declares. Across arithmetic their null is the noise model measured on benign arithmetic
   (`gate.noise`, `gate/noise_model.json`), never tonight's data: per comparison a t of the mean change over the
   seeds; per task, backbone and metric the pooled mean, the noise and the spread of its runs; per task and metric
   the shift (sign) test over every backbone. Where the change is the question (an accepted protocol or code change,
   other weights or data) the null is seed variance: the paired t, the suite-mean test, the moved and spread
   F-tests. Two Holm families at alpha / 2 each; a test fires when significant *and* past its magnitude floor. Worse
   is a regression, better an improvement; both fail unless improvements are allowed where they happened.
5. **What else fails a night** (`gate.decide`): a non-finite or `null` value, an untested comparison (unless
   allowed), a baseline cell that failed, a cell missing from tonight (unless allowed), and an unaccepted protocol
   change.
6. **Accepting a change** (`gate.ledger`): the acceptance ledger beside the anchor names what a night may accept
   (MODULE@FINGERPRINT, TASK:SETTING=VALUE), each entry only while it matches something.
"""

from .decide import Decision, Gate, decide

__all__ = ["Decision", "Gate", "decide"]
