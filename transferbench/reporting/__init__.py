"""Records store, statistics, tables, leaderboard, plots and the regression verdict."""
