"""A package whose model module imports its layers relatively."""
