"""Built-in training text for the tiny tokenizers (written for this project, no downloads).

The English corpus leans on the vocabulary Laya requests use (support tickets, policies,
decisions, the fixed strings the sequence builder renders) so the tiny tokenizers split
realistic requests into plausible pieces. The multilingual corpus covers several languages
and scripts; a few scripts are deliberately absent so byte fallback gets exercised.
"""

from __future__ import annotations

# Strings the sequence builder itself renders (laya 0.4.15 common.py); frequent on purpose.
RENDERED = """\
choice question: score question: noul question: level 0: level 1: level 2: level 3: level 4:
false: no, the statement does not hold
true: yes, the statement holds
choice question: Which team should handle this ticket?
score question: How urgent is this request, from level 0 (not urgent) to level 4 (critical)?
noul question: The customer is asking for a refund.
"""

ENGLISH = (
    RENDERED
    + """\
The customer wrote to say that the package arrived late and the box was damaged.
I was charged twice for the same order and I would like the second payment refunded.
Please cancel my subscription before the next billing date; I no longer need the service.
My account was locked after several failed login attempts and the reset email never came.
The invoice lists a price that is higher than the one shown on the website yesterday.
Our team reviewed the request and decided to escalate it to the billing department.
Can you tell me when the new version will be released and whether it fixes the crash?
The application crashes every time I try to upload a photo larger than ten megabytes.
We appreciate your patience while our engineers investigate the outage in the north region.
The delivery driver left the parcel at the wrong address, and the neighbour returned it.
I would like to change the shipping address on order number 48213 to my office.
Thank you for the quick response; the issue is resolved and the ticket can be closed.
The contract renews automatically unless either party gives thirty days written notice.
Refunds are issued to the original payment method within five to seven business days.
Security notice: someone tried to sign in to your account from an unrecognised device.
The product description says waterproof, but water leaked in after a short walk in the rain.
Is it possible to upgrade my plan in the middle of the month and pay only the difference?
The meeting has been moved to Thursday afternoon because the manager is travelling.
Sales asked whether the discount can be extended to the enterprise customers as well.
Legal must approve every change to the privacy policy before it is published.
A user reported that the search results are empty when the query contains an apostrophe.
The warehouse is out of stock for the blue model; the green one ships tomorrow.
Please confirm the appointment for Monday at nine in the morning, or suggest another time.
The temperature in the server room rose above the threshold and the alarm went off.
The patient asked for a copy of the test results and a summary from the doctor.
Our hotel booking was cancelled without notice and the replacement room was smaller.
The student wants an extension for the assignment because of a family emergency.
The flight was delayed by four hours, so the passenger missed the connecting train.
This message looks like spam: it promises a prize and asks for bank account details.
The supplier increased the price of raw materials by twelve percent this quarter.
Decision: approve the request, deny the request, or ask a human reviewer to decide.
How confident is the model that the answer is correct, and should it abstain instead?
Priority levels are low, medium, high and critical; critical issues page the on-call engineer.
Sentiment can be positive, neutral or negative, and sarcasm often hides a complaint.
The router reads the language of the message and sends it to the right checkpoint.
Every question has a type: a choice between labels, a score on a scale, or a yes or no statement.
The support agent should reply politely, summarise the problem and propose the next step.
Returned items must be unused, in their original packaging, and sent back within thirty days.
The printer on the third floor is jammed again and nobody has the key to the supply cabinet.
The quarterly report shows revenue growth in Europe but a decline in North America.
Employees can work from home two days a week if their manager agrees in writing.
The library extended its opening hours during the examination period.
A water pipe burst in the kitchen, flooding the floor and damaging the electrical sockets.
The insurance claim was rejected because the photographs were taken after the repair.
The recipe needs two eggs, a cup of flour, a pinch of salt and some warm milk.
Children under twelve travel free when accompanied by an adult with a valid ticket.
The marketing email had a broken link, and several readers complained on social media.
Update the password policy: at least twelve characters, one number and one symbol.
The courier will collect the return from your door between eight and noon.
Please forward the signed agreement to the finance team and keep a copy for your records.
Her laptop battery drains quickly even when the screen brightness is turned down.
They requested a quote for three hundred units with delivery to the Berlin warehouse.
Overdue invoices receive a reminder after seven days and a late fee after thirty.
The survey asked how likely the customer is to recommend the product to a friend.
Weather warning: heavy snow is expected overnight, and several roads may close.
The doctor recommended rest, plenty of water, and a follow-up visit next week.
Our bank detected unusual activity and temporarily froze the card as a precaution.
This feature request has been upvoted by many users and is scheduled for review.
The bug only appears on older phones running the previous operating system.
The landlord agreed to fix the heating, but the technician has not arrived yet.
Use the tracking number in the confirmation email to follow your shipment online.
The conference accepted our paper, and the presentation is scheduled for the last day.
He complained that the headphones stopped working after only three weeks of use.
The gym membership can be paused for up to three months for medical reasons.
Translate the message into English, then classify the intent and the urgency.
Questions about taxes should be directed to a qualified accountant.
I want to speak to a manager about the rude behaviour of the staff at the store.
{"ticket_id": 1042, "channel": "email", "subject": "Refund not received", "priority": "high"}
{"user": "alice", "role": "admin", "last_login": "2024-05-01", "status": "active"}
{"order": {"id": "A-77", "items": 3, "total": 59.90, "currency": "EUR"}, "paid": true}
[{"role": "user", "content": "Where is my order?"}, {"role": "assistant", "content": "Let me check."}]
Numbers and codes: 0 1 2 3 4 5 6 7 8 9 10 12 15 20 24 30 48 50 64 100 192 256 512 1024 2024.
Punctuation matters: commas, full stops; colons: and semicolons; quotes "like this" and 'this'.
"""
)

# Several languages and scripts. Hebrew, Thai and Georgian are deliberately left out, so the
# byte-fallback path (<0x..> tokens) is exercised by states written in them.
MULTILINGUAL = (
    RENDERED
    + """\
The customer was charged twice and asks for a refund of the second payment.
Please cancel my subscription; I no longer need the service.
Der Kunde wurde zweimal belastet und bittet um Rückerstattung der zweiten Zahlung.
Mein Konto wurde gesperrt, nachdem ich mehrmals das falsche Passwort eingegeben hatte.
Bitte kündigen Sie mein Abonnement zum nächsten möglichen Termin.
Le client a été débité deux fois et demande le remboursement du second paiement.
Mon colis est arrivé en retard et la boîte était abîmée.
Pouvez-vous changer l'adresse de livraison de ma commande, s'il vous plaît ?
El cliente recibió dos cargos y solicita el reembolso del segundo pago.
Mi pedido llegó tarde y la caja estaba dañada; quiero una devolución.
¿Puedo cambiar la dirección de envío de mi pedido?
O cliente foi cobrado duas vezes e pede o reembolso do segundo pagamento.
Quero cancelar a minha assinatura antes da próxima cobrança.
Il cliente è stato addebitato due volte e chiede il rimborso.
De klant is twee keer belast en vraagt om terugbetaling van de tweede betaling.
Kunden debiterades två gånger och vill ha tillbaka den andra betalningen.
Klient został obciążony dwa razy i prosi o zwrot drugiej płatności.
Müşteri iki kez ücretlendirildi ve ikinci ödemenin iadesini istiyor.
Khách hàng bị trừ tiền hai lần và yêu cầu hoàn lại khoản thanh toán thứ hai.
Клиента списали деньги дважды, и он просит вернуть второй платёж.
Пожалуйста, отмените мою подписку до следующего списания.
Мою посилку доставили із запізненням, а коробка була пошкоджена.
Ο πελάτης χρεώθηκε δύο φορές και ζητά επιστροφή χρημάτων.
تم خصم المبلغ من العميل مرتين ويطلب استرداد الدفعة الثانية.
يرجى إلغاء اشتراكي قبل موعد الفاتورة القادمة.
ग्राहक से दो बार शुल्क लिया गया और वह दूसरी राशि की वापसी चाहता है।
कृपया मेरी सदस्यता अगली बिलिंग तारीख से पहले रद्द करें।
গ্রাহকের কাছ থেকে দুবার টাকা কাটা হয়েছে এবং তিনি ফেরত চান।
客户被扣款两次，要求退还第二笔付款。
请在下一个账单日期之前取消我的订阅。
お客様は二重に請求されたため、二回目の支払いの返金を求めています。
荷物が遅れて届き、箱が壊れていました。
고객이 두 번 청구되어 두 번째 결제의 환불을 요청했습니다.
다음 결제일 전에 구독을 취소해 주세요.
Mteja alitozwa mara mbili na anaomba kurejeshewa malipo ya pili.
Pelanggan dikenakan biaya dua kali dan meminta pengembalian dana.
{"ticket_id": 7, "lang": "de", "subject": "Rückerstattung", "priority": "hoch"}
{"usuario": "maría", "estado": "activo", "pedido": {"id": "B-12", "total": 42.5}}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 24 30 48 100 256 1024 2024.
"""
)


def english_lines() -> list[str]:
    return [line for line in ENGLISH.splitlines() if line.strip()]


def multilingual_lines() -> list[str]:
    return [line for line in MULTILINGUAL.splitlines() if line.strip()]
