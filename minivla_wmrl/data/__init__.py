"""Demonstration data: LIBERO hdf5 files, action chunks, dataset statistics."""
