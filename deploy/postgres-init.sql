-- One database per service: no service reads another's tables.
CREATE DATABASE scheduler OWNER taskgate;
CREATE DATABASE pending OWNER taskgate;
CREATE DATABASE notifier OWNER taskgate;
CREATE DATABASE gateway OWNER taskgate;
