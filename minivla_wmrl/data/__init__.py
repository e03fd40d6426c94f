"""Data: demonstrations (scripted LIBERO and gymnasium experts), LIBERO hdf5 and LeRobot datasets,
action chunks, rollout trajectories as datasets, and the replay store of real-labelled episodes."""
