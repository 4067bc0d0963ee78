"""The word lists and letters Latin-script language detection weighs (`laya_onnx.core.lang`).

Our own lists (not the reference's): function words and common support-request words per
language, the words several languages share, and the letters ordinary English does not use.
`parity/lang/README.md` tells how they were chosen and what they agree on with the reference.
"""

from __future__ import annotations

from collections import Counter

__all__ = [
    "ENGLISH_LOOKALIKES",
    "ENGLISH_ONLY",
    "FUNCTION_WORDS",
    "NON_ENGLISH_LETTERS",
    "NORDIC_SHARED",
    "SHARED",
    "SHORT_SWEDISH",
]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Function words and common support-request words of each language. Which frequent words count,
# and which stay out because a neighbour writes them too, is what decides a route, so those
# choices follow the reference's (measured over `parity/lang/`, see its README): English leaves
# out `a`, `de`, `en`, `no`, `me`, `he`, `or`, `so`, `also`, `an`, `am`, `by`, `her`, `thanks`;
# the Romance lists leave out `de`, `a` and `no`; Dutch and Romanian keep a short core; Swedish
# keeps the words Danish and Norwegian do not write the same way.
FUNCTION_WORDS: dict[str, frozenset[str]] = {
    "en": _words(
        """
        the this that these those is are was were be been being have has does did done doing will
        would shall should can could might must not and but if because while until than then when
        where why how what which who whom with without within from into onto of to for at on in as
        after before between through during down i you she it we they him his them my your yours
        our their its there here please only very too never always already yet ever any some every
        each many much few both nor doesn didn isn aren wasn weren haven hasn won wouldn couldn
        dont doesnt didnt isnt wasnt havent wont ive youre thats whats
        """
    ),
    "fr": _words(
        """
        le la les des une du au aux ce cette ces et ou mais donc est sont ont être je tu il elle
        nous vous ils elles mon ton ma ta sa mes tes ses que qui pour dans sur avec pas plus très
        bien tout tous toute fait veux veut peux peut dois doit deux trois jour jours mois fois
        quand comment pourquoi alors merci bonjour suis ai avez avons été votre vos notre nos moi
        chez aussi encore déjà jamais rien voudrais pouvez depuis après avant hier demain
        """
    ),
    "de": _words(
        """
        der die das den dem ein eine einen einem einer und oder aber ist sind bin bist wurde werden
        wird habe hat haben hatte ich wir mir mich dir dich uns sich mein meine meinen meinem meiner
        diese dieser diesen dieses nicht mit für auf von zu zum zur im aus bei nach noch auch wie wo
        wann warum welche bitte danke heute jetzt kann kannst können möchte muss gibt sehr schon nur
        kein keine über ohne durch gegen unser in was
        """
    ),
    "es": _words(
        """
        el la los las un una y que qué por para con sin como cómo cuando donde dónde porque aunque
        pero es son está estoy soy fue fueron ser hay han hemos tiene tienen tengo puede pueden
        quiero necesito se del al lo le les su sus mi tu nos yo ni dos tres este esta eso esto esa
        ese todo nada algo más muy también ya nunca siempre sobre entre desde aquí hoy gracias
        """
    ),
    "pt": _words(
        """
        o os as um uma e que para com por em do da dos das na nas nos ao aos pelo pela não nao é
        são sao está estou estamos foi era ser sou tem tenho pode podem quero preciso gostaria eu
        meu minha meus minhas seu sua nosso nossa você vocês voce voces vc vcs se mas como quando
        onde porque mais muito já ja ainda agora hoje ontem depois antes então entao até tá pra
        isso isto este esta aqui ali tudo nada dois três obrigado obrigada olá também tambem
        consigo estava ficou fiz deu ninguém ninguem alguém alguem nenhum nenhuma
        """
    ),
    "it": _words(
        """
        il lo la le gli un uno una e ed o che di da su per con tra fra non è si mi ci ne del della
        dello dei degli delle nel nella nell negli sul sulla sulle dal dalla dallo dagli alla alle
        agli col sono era stato stata ho hai ha abbiamo avete hanno devo deve devono voglio vorrei
        mio mia tuo sua questo questa come quando dove perche perché anche più molto poco sempre
        mai già ancora adesso oggi ieri grazie ciao scusa
        """
    ),
    "nl": _words(
        """
        het een van is op te dat niet met voor zijn aan door maar ook naar deze worden wordt
        """
    ),
    "sv": _words(
        """
        jag är och inte att från till också måste vill ska skulle behöver får gör göra här när två
        mitt min mig om vi kommer upp utan nästa dessa detta säger hjälp hjälpa behover hjalp
        hjalpa nar tva lösenord losenord återbetalning aterbetalning faktura kvittot appen fel paket
        """
    ),
    "ro": _words(
        """
        și să este sunt care pentru din în dar după până fără ale lui fost acum vreau trebuie
        foarte acest această acesta aceasta mi ți vă nu
        """
    ),
    "bn": _words(
        """
        ami amar amake amra amader apni apnar apnake apnara tumi tomar tomake tomra tader ota eita
        oita ekta ei oi ki keno kivabe kibhabe kothay kokhon kobe koto kintu jodi tahole ar theke
        jonno sathe shathe diye niye moddhe kore korte korchi korsi korbo korechi koreche korun
        koren korlam hobe hoyeche hoise hocche hoyni chai chaina lagbe parchi parbo parchina
        peyechi paini dite dilam diyechi nai khub onek ekhon akhon ekhono abar ekbar duibar ajke
        kalke taka bhalo valo kharap shomossa somossa dhonnobad bhai shob keu kichu bolte bolun
        parben asbe jabe pabo ferot dorkar hoye geche gese
        """
    ),
    "az": _words(
        """
        və ve bir bu üçün ucun ilə ile olan olub olmasa var yox yoxdur mən sən biz siz onlar daha
        çox cox hər nə kimi görə sonra əgər eger deyil lakin amma ancaq artıq artiq də isə həm
        yalnız yalniz
        """
    ),
}
# A word of several lists says "not English" without saying which language.
_ALL_LISTED = Counter(w for words in FUNCTION_WORDS.values() for w in words)
# Words Danish and Norwegian share with Swedish: they say "Nordic", never "Swedish" by themselves.
NORDIC_SHARED = _words("hej ja nej jo tack mig min om kommer får skulle vi")
SHARED = frozenset(w for w, n in _ALL_LISTED.items() if n > 1) | NORDIC_SHARED
ENGLISH_ONLY = FUNCTION_WORDS["en"] - SHARED
# Foreign function words that are everyday English words too: a repeat of one is one piece of
# evidence, not several ("do this, do that").
ENGLISH_LOOKALIKES = _words("come son do care todo im per plus") & frozenset(
    w for lg, words in FUNCTION_WORDS.items() if lg != "en" for w in words
)
# Two- and three-word Swedish requests that no other language writes this way.
SHORT_SWEDISH = _words(
    """
    lösenord losenord lösenordet losenordet glömt glomt glömde glomde behöver behover
    återbetalning aterbetalning inloggning inloggningen betalningen fakturan kvitto kvittot
    beställningen bestallningen leveransen prenumerationen abonnemanget felmeddelande
    """
)

# Letters ordinary English text does not use (lowercase; text is lowercased before counting).
NON_ENGLISH_LETTERS = frozenset(
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœß"  # French, Spanish, Portuguese, Italian, German, Nordic
    "ăşţșț"  # Romanian
    "ąćęłńśźż"  # Polish
    "čďěňřšťůž"  # Czech, Slovak
    "őű"  # Hungarian
    "ğı"  # Turkish
    "āēģīķļņū"  # Latvian, Lithuanian
    "đ"  # Croatian, Serbian Latin, Vietnamese
    "ə"  # Azerbaijani
)
