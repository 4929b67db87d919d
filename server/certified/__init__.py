"""The certified head (Guo et al.): training it on the clients' features, its removals and its queries' replies."""
