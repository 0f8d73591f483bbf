"""The runtime (private): the init request, backend selection, the process's state,
init/finalize, the getters, and the module-level collectives."""
