"""Evidence that embedded pretraining is real learning: a linear probe on frozen features of every
embedded downstream set, pretrained (`NAME@embedded`) vs the same backbone randomly initialised.

    python -m benchmarks.pretrain_probe [--backbones mu4,mu4_dpn,mu4_dtn] [--seeds 0]

The probe is scikit-learn's logistic regression on standardised features, fit on train800 and scored
on test. Both backbones are probed with both poolings (cls token and mean of patch tokens) and each is
credited with its better one per set, so the gain is not an artefact of pooling. Pretraining runs on
demand (and is timed) when a checkpoint is missing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from tabulate import tabulate

from transferbench.adapters import prepare_task, resolve_backbone
from transferbench.backbones import create_backbone
from transferbench.data import embedded
from transferbench.data.folder import FolderDataset
from transferbench.data.transforms import eval_transform

RES = prepare_task("pretrain", suite="embedded").hparams["resolution"]  # the checkpoints' resolution


@torch.inference_mode()
def features(model, ds, pool: str, batch: int = 500) -> np.ndarray:
    model.eval()
    tf, out = eval_transform(RES), []
    for s in range(0, len(ds), batch):
        x = torch.stack([tf(ds.image(i)) for i in range(s, min(s + batch, len(ds)))])
        tok = model.forward_features(x)
        out.append((tok[:, 0] if pool == "tok" else tok[:, model.num_prefix_tokens :].mean(1)).numpy())
    return np.concatenate(out)


def probe(model, name: str, pool: str) -> float:
    root = embedded.ensure([name])
    tr, te = FolderDataset(root, name, "train800", verify=False), FolderDataset(root, name, "test", verify=False)
    scaler = StandardScaler().fit(ftr := features(model, tr, pool))
    clf = LogisticRegression(max_iter=2000, C=0.1).fit(scaler.transform(ftr), tr.labels)
    return 100.0 * float((clf.predict(scaler.transform(features(model, te, pool))) == te.labels).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbones", default="mu4,mu4_dpn,mu4_dtn")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows, gaps = [], {}
    for name in args.backbones.split(","):
        t = time.time()
        ref = resolve_backbone(f"{name}@embedded")  # pretrains on demand
        pretrain_s = time.time() - t
        torch.manual_seed(0)
        random = create_backbone(name, img_size=RES)
        trained = create_backbone(name, img_size=RES, checkpoint=ref.checkpoint)
        for ds in embedded.DOWNSTREAM:
            r = max(probe(random, ds, "tok"), probe(random, ds, "gap"))
            p = max(probe(trained, ds, "tok"), probe(trained, ds, "gap"))
            rows.append([name, ds, f"{r:.1f}", f"{p:.1f}", f"{p - r:+.1f}"])
            gaps.setdefault(name, []).append(p - r)
        rows.append([name, "**mean**", "", "", f"**{np.mean(gaps[name]):+.1f}**"])
        print(f"{name}: pretraining {pretrain_s:.0f} s (0 if cached)", flush=True)
    print(tabulate(rows, ["backbone", "dataset", "random init", "pretrained", "gain"], tablefmt="github"))


if __name__ == "__main__":
    main()
