int plugin_dep_value(void) { return 42; }
