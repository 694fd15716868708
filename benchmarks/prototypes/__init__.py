"""Prototype kernels kept to compare against what minicomp generates (the Gluon attention
forms the Hopper kernel grew from). Scripts, run on the GPU machine; nothing in minicomp or
the suite imports them."""
