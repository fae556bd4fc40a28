CREATE TABLE orders (
	id       uuid   PRIMARY KEY,
	customer text   NOT NULL,
	amount   bigint NOT NULL);
