-- name: CreateOrder :one
INSERT INTO orders (id, customer, amount) VALUES ($1, $2, $3)
RETURNING id, customer, amount;

-- name: GetOrder :one
SELECT id, customer, amount FROM orders WHERE id = $1;
