"""What leaves profwatch: alert sinks, HTTP posts, metrics, the HTML report, sd_notify."""
