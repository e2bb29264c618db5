"""A subject of the world corpus by its source and name: a transformers model type or a
package adapter (`_world_packages.py`)."""


def run_subject(source: str, name: str, discover: bool = False) -> dict:
    if source == "transformers":
        import _world_arch
        from _world_candidates import candidates

        by_type = {c.model_type: c for c in candidates()[0]}
        return _world_arch.run(by_type[name], discover=discover)
    import _world_packages

    return _world_packages.run(name, discover=discover)
