"""Decoding caches that start as NaN, for tests that prove no step reads a position (or a
cache row) before it is written: the one-position step's caches are ``new_empty``."""


def fill_new_caches_with_nan(monkeypatch):
    """While ``monkeypatch`` is active, every ``EagerSteps`` (and ``CompiledSteps``) cache is
    NaN when made: a read of a position nothing wrote makes the logits NaN."""
    from transformerkit.decoding.eager_steps import EagerSteps

    unfilled = EagerSteps._empty_caches

    def nan_filled(self, rows, max_len, like):
        caches = unfilled(self, rows, max_len, like)
        for keys, values in caches:
            keys.fill_(float("nan"))
            values.fill_(float("nan"))
        return caches

    monkeypatch.setattr(EagerSteps, "_empty_caches", nan_filled)
