"""Parameter counts per model component."""


def parameter_summary(model):
    """Count parameters per component: ``{"embeddings": n, "encoder": n, ..., "total": n}``.

    Each variable is counted once, in the first component that uses it, so tied embeddings
    are not counted twice. Non-trainable fixed tables (sinusoidal positions) are not
    parameters and are left out. The model is built first if needed.
    """
    if not model.built:
        model.build(None)
    seen, counts = set(), {}
    for name, layers in model.components().items():
        count = 0
        for layer in layers:
            for variable in layer_parameters(layer):
                key = id(variable)
                if key not in seen:
                    seen.add(key)
                    count += int(_size(variable.shape))
        counts[name] = count
    counts["total"] = sum(counts.values())
    return counts


def layer_parameters(layer):
    """The variables of ``layer`` that are parameters: its trainable weights and its frozen
    learned matrices, not fixed tables (sinusoidal positions)."""
    return layer.trainable_weights + _frozen_parameters(layer)


def count_parameters(layer):
    """The number of parameters of ``layer`` (:func:`layer_parameters`)."""
    return sum(int(_size(v.shape)) for v in layer_parameters(layer))


def _frozen_parameters(layer):
    """Frozen learned matrices (e.g. frozen pretrained embeddings) still count as parameters."""
    if layer.trainable:
        return []
    return [w for w in layer.non_trainable_weights if "table" not in w.path]


def _size(shape):
    n = 1
    for dim in shape:
        n *= dim
    return n


def format_summary(counts):
    """A small text table of :func:`parameter_summary` output."""
    width = max(len(k) for k in counts)
    lines = [f"{'component':<{width}}  {'parameters':>14}"]
    for name, n in counts.items():
        lines.append(f"{name:<{width}}  {n:>14,}")
    return "\n".join(lines)
